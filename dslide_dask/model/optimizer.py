"""Adam bookkeeping shared by every layer."""

from __future__ import annotations

import math

from dslide_dask.model.config import SlideConfig


def adam_lr(cfg: SlideConfig, step: int) -> float:
    """Bias-corrected Adam step size for update number ``step`` (1-based)."""
    return cfg.lr * math.sqrt(1.0 - cfg.beta2**step) / (1.0 - cfg.beta1**step)

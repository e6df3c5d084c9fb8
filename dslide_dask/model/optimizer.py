"""Adam bookkeeping shared by every layer: the step size at each update."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from dslide_dask.model.config import SlideConfig


def is_moment(name: str) -> bool:
    """Whether a layer's state array is an Adam moment (``NAME.m``, ``NAME.v``): what only
    training reads, as much again as the weights."""
    return name.endswith((".m", ".v"))


def arrays_to_read(names: Iterable[str], moments: bool) -> list[str]:
    """Of a layer's state arrays ``names``, those a load reads: all, or without
    ``moments`` all but the Adam moments (a model loaded to answer)."""
    return [name for name in names if moments or not is_moment(name)]


def lr_factor(cfg: SlideConfig, step: int) -> float:
    """The schedule's multiple of ``cfg.lr`` at update number ``step`` (1-based).

    A pure function of the step: every shard computes it from its own step count, so a
    schedule costs no message between workers.
    """
    if step <= cfg.warmup_steps:
        return step / cfg.warmup_steps
    start = cfg.warmup_steps + (cfg.stable_steps or 0)  # the decay's first step
    if cfg.lr_schedule == "constant" or cfg.decay_steps == 0 or step <= start:
        return 1.0
    x = min(1.0, (step - start) / max(1, cfg.decay_steps - start))
    shape = 0.5 * (1.0 + math.cos(math.pi * x)) if cfg.lr_schedule == "cosine" else 1.0 - x
    return cfg.lr_floor + (1.0 - cfg.lr_floor) * shape


def scheduled_lr(cfg: SlideConfig, step: int, base: float | None = None) -> float:
    """The learning rate of update number ``step`` before Adam's bias correction (what
    the per-step statistics report): ``cfg.lr``, or ``base`` (a wide layer's
    ``cfg.input_lr``/``cfg.output_lr``) on the same schedule."""
    lr = cfg.lr if base is None else base
    assert lr is not None, "the learning rate is chosen by SlideConfig.for_data"
    return lr * lr_factor(cfg, step)


def adam_lr(cfg: SlideConfig, step: int) -> float:
    """Bias-corrected Adam step size of the dense parameters, which take a step every
    update, for update number ``step`` (1-based), scheduled."""
    bias_correction = math.sqrt(1.0 - cfg.beta2**step) / (1.0 - cfg.beta1**step)
    return scheduled_lr(cfg, step) * bias_correction


def with_row_updates(arrays: dict[str, np.ndarray], name: str, rows: int, step: int) -> dict:
    """``arrays`` with the per-row update counts ``name``, which checkpoints written
    before rows counted their own updates lack: those runs corrected every row by the
    global step, so every row is taken to be ``step`` updates old."""
    if name in arrays:
        return arrays
    return {**arrays, name: np.full(rows, min(step, np.iinfo(np.int32).max), np.int32)}

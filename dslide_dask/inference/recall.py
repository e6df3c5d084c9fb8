"""How much of the exact top-k an approximate top-k finds."""

import numpy as np


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over rows of ``|found[i] & exact[i]| / k`` (ids ``[rows, k]``; -1 in
    ``found`` is no label and never counts)."""
    if found.shape != exact.shape:
        raise ValueError(f"shapes differ: {found.shape} and {exact.shape}")
    if found.size == 0:
        return 1.0
    hits = (found[:, :, None] == exact[:, None, :]) & (found[:, :, None] >= 0)
    return float(hits.any(axis=2).sum(axis=1).mean() / exact.shape[1])

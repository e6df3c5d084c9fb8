"""Ranking metrics for extreme classification."""

from __future__ import annotations

from collections.abc import Iterable

import numba
import numpy as np

from dslide_dask.data.csr import CSR


@numba.njit(cache=True, nogil=True)
def _hits(topk: np.ndarray, y_indptr: np.ndarray, y_indices: np.ndarray) -> np.ndarray:
    """hits[i, j] = 1 if topk[i, j] is one of row i's labels."""
    n, k = topk.shape
    hits = np.zeros((n, k), np.float64)
    for i in range(n):
        lo, hi = y_indptr[i], y_indptr[i + 1]
        for j in range(k):
            for p in range(lo, hi):
                if y_indices[p] == topk[i, j]:
                    hits[i, j] = 1.0
                    break
    return hits


def precision_at_k(topk: np.ndarray, Y: CSR, ks: Iterable[int] = (1, 3, 5)) -> dict[str, float]:
    """P@k for each k in ``ks``: the mean fraction of the top k predictions that are true.

    ``topk[i]`` holds row i's predicted label ids, best first (at least max(ks) columns).
    """
    topk = np.ascontiguousarray(topk, dtype=np.int64)
    ks = sorted(set(int(k) for k in ks))
    if topk.ndim != 2 or topk.shape[0] != Y.n_rows:
        raise ValueError(f"topk must be ({Y.n_rows}, k), got {topk.shape}")
    if ks and (ks[0] < 1 or ks[-1] > topk.shape[1]):
        raise ValueError(f"k must be in [1, {topk.shape[1]}], got {ks}")
    if Y.n_rows == 0:
        return {f"P@{k}": float("nan") for k in ks}
    cum = np.cumsum(_hits(topk, Y.indptr, Y.indices), axis=1)
    return {f"P@{k}": float(cum[:, k - 1].mean() / k) for k in ks}


def most_frequent_topk(Y: CSR, n_rows: int, k: int) -> np.ndarray:
    """The baseline prediction: the k most frequent labels of ``Y`` for each of ``n_rows``
    rows."""
    top = np.argsort(-np.bincount(Y.indices, minlength=Y.n_cols), kind="stable")[:k]
    return np.broadcast_to(top, (n_rows, k))

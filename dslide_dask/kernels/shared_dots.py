"""Dot products of query rows with labels' sparse vectors, a label read once a batch.

A served batch asks the same frequent labels again and again, and theirs are the long
vectors: at 670K labels a batch of 256 rows scores 13K (row, leaf classifier) pairs a
tree, 8.7K distinct classifiers, but the pairs' gathers read 9.9M weights against 2.2M
in the distinct classifiers. A pair scored by a gather of the row's spread query over
the label's entries reads the label once a pair. Here a label that enough pairs ask for
is spread over a dense vector of the features once, and each of its rows is a gather of
the row's own ~76 features from it; the rest are left to the caller's gather.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def shared_groups(labels: np.ndarray, v_ptr: np.ndarray, q_nnz: float, min_rows: int):
    """``(order, starts)``: the pairs sorted by label (``order``) and the bounds in it of
    the labels worth spreading (``starts[g]:starts[g+1]`` for even ``g``): asked by
    ``min_rows`` pairs or more, and cheaper spread and cleared (twice the label's entries)
    then gathered at ``q_nnz`` a row than gathered a pair at a time."""
    order = np.argsort(labels, kind="mergesort")
    starts = np.empty(2 * labels.shape[0] + 2, np.int64)
    n_bounds = 0
    a = 0
    while a < order.shape[0]:
        lab = labels[order[a]]
        b = a + 1
        while b < order.shape[0] and labels[order[b]] == lab:
            b += 1
        size = v_ptr[lab + 1] - v_ptr[lab]
        if b - a >= min_rows and (b - a) * (size - q_nnz) > 2 * size:
            starts[n_bounds] = a
            starts[n_bounds + 1] = b
            n_bounds += 2
        a = b
    return order, starts[:n_bounds]


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def shared_dots(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    rows: np.ndarray,
    labels: np.ndarray,
    v_ptr: np.ndarray,
    v_idx: np.ndarray,
    v_val: np.ndarray,
    n_features: int,
    min_rows: int,
    n_chunks: int,
) -> np.ndarray:
    """Per pair ``p``: the dot product of query row ``r = rows[p]``
    (``q_idx/q_val[q_ptr[r]:q_ptr[r+1]]``, features below ``n_features``) with label
    ``l = labels[p]``'s vector ``v_idx/v_val[v_ptr[l]:v_ptr[l+1]]`` where the label is
    worth spreading (:func:`shared_groups`), else NaN (the caller's to compute)."""
    out = np.full(rows.shape[0], np.nan, np.float32)
    n_rows = q_ptr.shape[0] - 1
    q_nnz = (q_ptr[n_rows] - q_ptr[0]) / max(n_rows, 1)
    order, starts = shared_groups(labels, v_ptr, q_nnz, min_rows)
    n_groups = starts.shape[0] // 2
    n_chunks = max(1, min(n_groups, n_chunks))
    for chunk in numba.prange(n_chunks):
        if n_groups == 0:
            continue
        dense = np.zeros(n_features, np.float32)
        for g in range(chunk * n_groups // n_chunks, (chunk + 1) * n_groups // n_chunks):
            a, b = starts[2 * g], starts[2 * g + 1]
            lab = labels[order[a]]
            for e in range(v_ptr[lab], v_ptr[lab + 1]):
                dense[v_idx[e]] = v_val[e]
            for s in range(a, b):
                p = order[s]
                i = rows[p]
                total = np.float32(0.0)
                for q in range(q_ptr[i], q_ptr[i + 1]):
                    total += q_val[q] * dense[q_idx[q]]
                out[p] = total
            for e in range(v_ptr[lab], v_ptr[lab + 1]):
                dense[v_idx[e]] = 0.0
    return out

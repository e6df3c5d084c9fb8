"""Label centroids over sparse rows: each label's normalised sum of its points' unit rows
(a query's cosine with them is :func:`~dslide_dask.kernels.neighbours.row_cosines`').

A centroid row is pruned of its entries under ``prune`` (of its unit norm): a frequent
label's sum touches most features with crumbs, a rare label's keeps nearly all.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _label_sum(points, row_ptr, row_idx, row_val, acc, touched) -> tuple[int, float]:
    """Add the rows ``points`` into ``acc`` (dense over features, zero where untouched),
    listing the features touched in ``touched``: how many there are, and the factor that
    scales their sum to unit norm (0 for an empty sum)."""
    n = 0
    for p in points:
        for e in range(row_ptr[p], row_ptr[p + 1]):
            f = row_idx[e]
            if acc[f] == 0.0:
                touched[n] = f
                n += 1
            acc[f] += row_val[e]
            if acc[f] == 0.0:  # cancelled (or a stored zero): keep it marked as touched
                acc[f] = np.float32(1e-30)
    norm = 0.0
    for t in range(n):
        norm += acc[touched[t]] * acc[touched[t]]
    return n, 1.0 / np.sqrt(norm) if norm > 0.0 else 0.0


@numba.njit(cache=True, nogil=True, parallel=True)
def centroids(
    row_ptr: np.ndarray,
    row_idx: np.ndarray,
    row_val: np.ndarray,
    label_ptr: np.ndarray,
    label_pts: np.ndarray,
    n_features: int,
    prune: float,
    n_blocks: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per label (its points ``label_pts[label_ptr[l]:label_ptr[l+1]]``, rows of
    ``row_*`` with unit norms): the normalised sum of its points' rows, less the entries
    under ``prune``, as CSR by label (features ascending). Two passes, counting then
    filling, each over disjoint blocks of labels: the result does not depend on threads."""
    n_labels = label_ptr.shape[0] - 1
    n_blocks = max(1, min(n_labels, n_blocks))
    ptr = np.zeros(n_labels + 1, np.int64)
    for blk in numba.prange(n_blocks):
        acc = np.zeros(n_features, np.float32)
        touched = np.empty(n_features, np.int64)
        for lab in range(blk * n_labels // n_blocks, (blk + 1) * n_labels // n_blocks):
            points = label_pts[label_ptr[lab] : label_ptr[lab + 1]]
            n, scale = _label_sum(points, row_ptr, row_idx, row_val, acc, touched)
            for f in touched[:n]:
                ptr[lab + 1] += abs(acc[f] * scale) >= prune
                acc[f] = 0.0
    for lab in range(n_labels):
        ptr[lab + 1] += ptr[lab]
    idx = np.empty(ptr[n_labels], np.int32)
    val = np.empty(ptr[n_labels], np.float32)
    for blk in numba.prange(n_blocks):
        acc = np.zeros(n_features, np.float32)
        touched = np.empty(n_features, np.int64)
        for lab in range(blk * n_labels // n_blocks, (blk + 1) * n_labels // n_blocks):
            points = label_pts[label_ptr[lab] : label_ptr[lab + 1]]
            n, scale = _label_sum(points, row_ptr, row_idx, row_val, acc, touched)
            out = ptr[lab]
            for f in np.sort(touched[:n]):
                v = acc[f] * scale
                if abs(v) >= prune:
                    idx[out] = f
                    val[out] = v
                    out += 1
                acc[f] = 0.0
    return ptr, idx, val

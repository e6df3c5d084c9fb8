"""Label centroids over sparse rows: each label's normalised sum of its points' unit rows
(a query's cosine with them is :func:`~dslide_dask.kernels.neighbours.row_cosines`').

A centroid row is pruned of its entries under ``prune`` (of its unit norm): a frequent
label's sum touches most features with crumbs, a rare label's keeps nearly all.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _accumulate(points, row_ptr, row_idx, row_val, acc, touched) -> int:
    """Add the rows ``points`` into ``acc`` (dense over features); the features first
    touched are appended to ``touched``; returns how many there are."""
    n = 0
    for p in points:
        for e in range(row_ptr[p], row_ptr[p + 1]):
            f = row_idx[e]
            if acc[f] == 0.0:
                touched[n] = f
                n += 1
            acc[f] += row_val[e]
            if acc[f] == 0.0:  # cancelled: keep it marked as touched
                acc[f] = np.float32(1e-30)
    return n


@numba.njit(cache=True, nogil=True)
def _scale(acc, touched, n: int) -> float:
    norm = 0.0
    for t in range(n):
        norm += acc[touched[t]] * acc[touched[t]]
    return 1.0 / np.sqrt(norm) if norm > 0.0 else 0.0


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
    counts = np.zeros(n_labels + 1, np.int64)
    for fill in range(2):
        if fill:
            for lab in range(n_labels):
                counts[lab + 1] += counts[lab]
            idx = np.empty(counts[n_labels], np.int32)
            val = np.empty(counts[n_labels], np.float32)
        else:
            idx = np.empty(0, np.int32)
            val = np.empty(0, np.float32)
        for blk in numba.prange(n_blocks):
            acc = np.zeros(n_features, np.float32)
            touched = np.empty(n_features, np.int64)
            for lab in range(blk * n_labels // n_blocks, (blk + 1) * n_labels // n_blocks):
                points = label_pts[label_ptr[lab] : label_ptr[lab + 1]]
                n = _accumulate(points, row_ptr, row_idx, row_val, acc, touched)
                scale = _scale(acc, touched, n)
                if fill:
                    kept = touched[:n].copy()
                    kept.sort()
                    out = counts[lab]
                    for f in kept:
                        v = acc[f] * scale
                        if abs(v) >= prune:
                            idx[out] = f
                            val[out] = v
                            out += 1
                else:
                    for t in range(n):
                        if abs(acc[touched[t]] * scale) >= prune:
                            counts[lab + 1] += 1
                for t in range(n):
                    acc[touched[t]] = 0.0
    return counts, idx, val

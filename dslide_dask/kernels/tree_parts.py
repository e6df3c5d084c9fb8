"""A label tree's path losses in two parts, for trees held in pieces: the classifiers above
the leaves for every candidate, then the leaf classifiers of the candidates chosen.

Whole, a tree scores a candidate's leaf only while the loss above it leaves the
candidate a chance of a row's best (:func:`~dslide_dask.kernels.tree_query.bounded_losses`).
A tree in pieces cannot decide that in one call, as no piece knows the whole loss above
the leaves: the pieces first answer their share of it (:func:`inner_path_losses`), and
then the leaf losses of the candidates still in the running (:func:`leaf_path_losses`).
"""

import numba
import numpy as np

from dslide_dask.kernels.tree_inner import inner_losses
from dslide_dask.kernels.tree_query import UNSEEN, _margin, above_leaf, hinge


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def inner_path_losses(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    cand: np.ndarray,
    position: np.ndarray,
    paths: np.ndarray,
    bias: np.ndarray,
    f_ptr: np.ndarray,
    f_child: np.ndarray,
    f_val: np.ndarray,
    n_inner: int,
    f_slot: np.ndarray,
    f_dense: np.ndarray,
    n_chunks: int,
) -> np.ndarray:
    """The sum of the squared hinge losses above the leaves on each candidate's path
    (:func:`~dslide_dask.kernels.tree_query.path_losses` less the leaf's: 0 for none,
    :data:`UNSEEN` for a label not in the tree), from the inner classifiers by feature."""
    n, m = cand.shape
    out = np.zeros((n, m), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for chunk in numba.prange(n_chunks):
        loss_of = np.empty(n_inner, np.float32)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            inner_losses(q_idx, q_val, q_ptr[i], q_ptr[i + 1], bias, f_ptr, f_child, f_val,
                         f_slot, f_dense, loss_of)  # fmt: skip
            for j in range(m):
                lab = cand[i, j]
                if lab < 0:
                    continue
                if lab >= position.shape[0] or position[lab] < 0:
                    out[i, j] = UNSEEN
                    continue
                out[i, j] = above_leaf(loss_of, paths[position[lab]])
    return out


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def leaf_path_losses(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    cand: np.ndarray,
    chosen: np.ndarray,
    position: np.ndarray,
    paths: np.ndarray,
    w_ptr: np.ndarray,
    w_feature: np.ndarray,
    w_val: np.ndarray,
    bias: np.ndarray,
    n_features: int,
    n_chunks: int,
) -> np.ndarray:
    """The squared hinge loss of the leaf classifier of each candidate where ``chosen``
    (0 elsewhere, and for a label not in the tree); a weightless leaf scores 0."""
    n, m = cand.shape
    n_levels = paths.shape[1]
    out = np.zeros((n, m), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for chunk in numba.prange(n_chunks):
        dense = np.zeros(n_features, np.float32)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            if not chosen[i].any():
                continue
            lo, hi = q_ptr[i], q_ptr[i + 1]
            for q in range(lo, hi):
                dense[q_idx[q]] = q_val[q]
            for j in range(m):
                lab = cand[i, j]
                if not chosen[i, j] or lab < 0 or lab >= position.shape[0] or position[lab] < 0:
                    continue
                c = paths[position[lab], n_levels - 1]
                if w_ptr[c] == w_ptr[c + 1] and bias[c] >= 1.0:
                    continue  # weightless here: its loss is another piece's
                z = bias[c] + _margin(
                    dense, q_idx, q_val, lo, hi, w_feature, w_val, w_ptr[c], w_ptr[c + 1]
                )
                out[i, j] = hinge(z)
            for q in range(lo, hi):
                dense[q_idx[q]] = 0.0
    return out

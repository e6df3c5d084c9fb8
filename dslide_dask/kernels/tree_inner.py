"""A label tree's classifiers above the leaves, scored all at once for a query row.

Their weights are laid out by feature (the classifiers' CSR transposed), and a row adds
each of its features' entries into every classifier's margin. A frequent feature's
entries name most of these classifiers (at 670K labels, the 614 features of 300 entries
or more of 2,080 hold 82% of a row's 27K entries), and adding them one at a time is a
scattered read-modify-write each, which no compiler turns into SIMD. Such a feature's
entries are kept as a dense row over the classifiers instead (:func:`dense_features`),
and a row adds it with one vectorised pass: the same products added to each margin in
the same order (a classifier without the feature adds ``v * 0``, which changes no sum),
so the margins are those of the entries one at a time, to the bit. What is left sparse
are the rarer features' entries, mostly cold: their first lines are asked for before
the row adds any.
"""

import numba
import numpy as np

from dslide_dask.kernels.neighbours import transpose
from dslide_dask.kernels.prefetch import prefetch_read, prefetch_run

#: A feature whose entries name at least this share of the classifiers above the leaves
#: is kept as a dense row over them (a dense row costs its width in 16-wide SIMD adds, an
#: entry a scattered add: a few cycles).
DENSE_SHARE = 1 / 8
#: Lines of each sparse feature's entries asked for before a row adds any: the rarer
#: features' entries are cold, and a row's misses then wait together (1-4 measured).
PREFETCH_LINES = 4


@numba.njit(cache=True, nogil=True)
def dense_features(f_ptr: np.ndarray, f_child: np.ndarray, f_val: np.ndarray, n_inner: int,
                   min_entries: int):  # fmt: skip
    """``(ptr, child, val, slot, dense)``: the by-feature entries ``f_*`` less those of the
    features of ``min_entries`` entries or more, which are instead rows of ``dense``
    (``(features, n_inner)``), feature ``f``'s at ``slot[f]`` (-1: none)."""
    n_features = f_ptr.shape[0] - 1
    slot = np.full(n_features, -1, np.int32)
    n_dense = 0
    for f in range(n_features):
        if f_ptr[f + 1] - f_ptr[f] >= max(min_entries, 1):
            slot[f] = n_dense
            n_dense += 1
    dense = np.zeros((n_dense, n_inner), np.float32)
    ptr = np.zeros(n_features + 1, np.int64)
    for f in range(n_features):
        ptr[f + 1] = ptr[f] + (0 if slot[f] >= 0 else f_ptr[f + 1] - f_ptr[f])
    child = np.empty(ptr[n_features], f_child.dtype)
    val = np.empty(ptr[n_features], np.float32)
    for f in range(n_features):
        s = slot[f]
        for e in range(f_ptr[f], f_ptr[f + 1]):
            if s >= 0:
                dense[s, f_child[e]] = f_val[e]
            else:
                at = ptr[f] + e - f_ptr[f]
                child[at] = f_child[e]
                val[at] = f_val[e]
    return ptr, child, val, slot, dense


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def inner_losses(q_idx, q_val, lo, hi, bias, f_ptr, f_child, f_val, slot, dense,
                 loss_of) -> None:  # fmt: skip
    """The squared hinge loss of every classifier above the leaves (``loss_of``) for the
    query row ``q_idx/q_val[lo:hi]``, from their weights by feature (:func:`dense_features`:
    the sparse entries ``f_*``, the dense rows ``dense`` of the features ``slot`` names)."""
    n_indexed = f_ptr.shape[0] - 1
    n = loss_of.shape[0]
    for q in range(lo, hi):  # every miss asked for at once, not one after another
        if q_idx[q] < n_indexed:
            prefetch_read(f_ptr, q_idx[q])
            prefetch_read(slot, q_idx[q])
    for q in range(lo, hi):
        f = q_idx[q]
        if f < n_indexed and slot[f] < 0:
            prefetch_run(f_child, f_ptr[f], f_ptr[f + 1], PREFETCH_LINES)
            prefetch_run(f_val, f_ptr[f], f_ptr[f + 1], PREFETCH_LINES)
    loss_of[:] = bias[:n]
    for q in range(lo, hi):
        f, v = q_idx[q], q_val[q]
        if f < n_indexed:
            s = slot[f]
            if s >= 0:
                _add_row(loss_of, v, dense[s])
            else:
                for e in range(f_ptr[f], f_ptr[f + 1]):
                    loss_of[f_child[e]] += v * f_val[e]
    for c in range(n):
        h = max(np.float32(0.0), np.float32(1.0) - loss_of[c])
        loss_of[c] = h * h


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def _add_row(out, v, row) -> None:
    """``out += v * row`` (a loop the compiler vectorises)."""
    for c in range(out.shape[0]):
        out[c] += v * row[c]


#: The leaf classifiers a served row scores by feature, beside those above the leaves:
#: the longest, which are the frequent labels' (most rows' candidates) and the costliest
#: to gather (at 670K labels the 2,048 longest hold 1.7M weights, 11K of them a row's).
HOT_LEAVES = 2048


def hot_leaves(w_ptr, w_feature, w_val, bias, n_inner: int, n_features: int,
               n_hot: int | None = None):  # fmt: skip
    """The ``n_hot`` longest leaf classifiers (children from ``n_inner`` on) laid out as
    :func:`inner_losses` reads them: ``(ptr, col, val, slot, dense, bias, col_of)``, their
    weights by feature as :func:`dense_features` gives them, their biases, and each
    child's column among them (-1: not hot, gathered); ``n_hot`` None: :data:`HOT_LEAVES`."""
    n_hot = HOT_LEAVES if n_hot is None else n_hot
    n_children = w_ptr.shape[0] - 1
    lengths = np.diff(w_ptr)[n_inner:]
    hot = np.sort(n_inner + np.argsort(-lengths, kind="stable")[:n_hot])
    col_of = np.full(n_children, -1, np.int32)
    col_of[hot] = np.arange(len(hot), dtype=np.int32)
    starts, lens = w_ptr[hot], np.diff(w_ptr)[hot]
    ptr = np.zeros(len(hot) + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    at = np.repeat(starts - ptr[:-1], lens) + np.arange(ptr[-1])  # their entries, in order
    by_feature = transpose(ptr, w_feature[at], w_val[at], n_features)
    rows = dense_features(*by_feature, len(hot), int(np.ceil(DENSE_SHARE * len(hot))))
    return (*rows, np.ascontiguousarray(bias[hot], np.float32), col_of)

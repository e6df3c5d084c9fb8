"""A label tree's score of candidate labels: the squared hinge losses on each one's path.

The classifiers above the leaves are few (2,080 at 670K labels) but wide: the root's
children weigh most features (100K of 136K each), so scoring one of them for a row by a
binary search per query feature cost about 1,300 dependent cache misses, and a row met
20 to 40 of them (1.3 ms a row a tree). Their weights are laid out by feature instead
(their CSR transposed, derived from the tree, never stored), and a row adds each
of its features' entries into every inner classifier's margin at once: a sequential read
(27K entries a row at 670K labels, 0.05 ms). The leaf classifiers (one a candidate; a
served candidate's has about 480 weights, as candidates are frequent labels) are scored
by a gather of the query spread over a dense array: :func:`path_losses` for every
candidate, :func:`bounded_losses` only for those that can still be among a row's best,
a batch's frequent candidates' leaf classifiers read once for all the rows naming them
(:mod:`~dslide_dask.kernels.shared_dots`: their leaves were 0.3 of a batched row's
0.42 ms at 670K labels). The longest leaf classifiers (the frequent labels', named by
most rows) are scored as those above the leaves are, by feature, for every row
(:func:`~dslide_dask.kernels.tree_inner.hot_leaves`): their weights' gathers were most
of a single row's leaf work, and an exact loss is a tighter bound.
"""

import numba
import numpy as np

from dslide_dask.kernels.prefetch import AHEAD, prefetch_run
from dslide_dask.kernels.shared_dots import shared_dots
from dslide_dask.kernels.tree_inner import PREFETCH_LINES, inner_losses

#: The path loss of a label not in the tree (no training row): its likelihood
#: ``exp(-power * UNSEEN)`` is 0, so it ranks below every label the tree holds.
UNSEEN = np.float32(1e4)
#: A leaf classifier with at most this many weights a feature of the query row is scored
#: by a gather over them, one with more by a binary search per query feature.
GATHER_RATIO = 64
#: A leaf classifier named by this many rows of a batch or more is scored for all of
#: them at once (:func:`bounded_losses`).
SHARED_ROWS = 3


@numba.njit(cache=True, nogil=True)
def inner_children(level_ptr: np.ndarray, child_ptr: np.ndarray) -> int:
    """How many children the classifier nodes above the leaf level have (they come first
    in the tree's numbering)."""
    n_levels = level_ptr.shape[0] - 1
    n_leaf_nodes = level_ptr[n_levels] - level_ptr[n_levels - 1] - 1
    return int(child_ptr[child_ptr.shape[0] - 1 - n_leaf_nodes])


@numba.njit(cache=True, nogil=True)
def _node_of(bounds: np.ndarray, p: int) -> int:
    """The node of a level (``bounds``: its nodes' first positions, then the end) that
    holds position ``p``."""
    return int(np.searchsorted(bounds, p, side="right")) - 1


@numba.njit(cache=True, nogil=True)
def child_paths(bounds: np.ndarray, level_ptr: np.ndarray, child_ptr: np.ndarray):
    """``(positions, levels)``: the child each classifier level scores on the path of the
    label at each tree position (what :func:`path_losses` would otherwise find by binary
    searches of the levels' bounds, a candidate at a time)."""
    n_levels = level_ptr.shape[0] - 1
    n = bounds[level_ptr[1] - 1]
    out = np.empty((n, n_levels), np.int32)
    for p in range(n):
        node_base = 0
        for v in range(n_levels):
            lb = bounds[level_ptr[v] : level_ptr[v + 1]]
            local = _node_of(lb, p)
            node = node_base + local
            node_base += lb.shape[0] - 1
            if v + 1 < n_levels:
                nb = bounds[level_ptr[v + 1] : level_ptr[v + 2]]
                out[p, v] = child_ptr[node] + _node_of(nb, p) - _node_of(nb, lb[local])
            else:
                out[p, v] = child_ptr[node] + p - lb[local]
    return out


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _margin(dense, q_idx, q_val, lo, hi, w_feature, w_val, e0, e1) -> np.float32:
    """The dot product of a query row (``q_idx/q_val[lo:hi]``, also spread over
    ``dense``) with one classifier's weights (``w_feature/w_val[e0:e1]``, ascending): a
    gather of ``dense`` at the weights' features, or, where the weights are many more
    than the row's features, a binary search of each of those."""
    total = np.float32(0.0)
    if e1 - e0 <= GATHER_RATIO * (hi - lo):
        for e in range(e0, e1):
            total += dense[w_feature[e]] * w_val[e]
        return total
    for q in range(lo, hi):
        at = e0 + np.searchsorted(w_feature[e0:e1], q_idx[q])
        if at < e1 and w_feature[at] == q_idx[q]:
            total += q_val[q] * w_val[at]
    return total


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def above_leaf(loss_of, path) -> np.float32:
    """The sum of the losses ``loss_of`` of the classifiers above the leaf on ``path``
    (a row of :func:`child_paths`)."""
    loss = np.float32(0.0)
    for v in range(path.shape[0] - 1):
        loss += loss_of[path[v]]
    return loss


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def hinge(z) -> np.float32:
    """The squared hinge loss ``max(0, 1 - z)^2`` of a margin ``z``."""
    h = max(np.float32(0.0), np.float32(1.0) - z)
    return h * h


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def path_losses(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    cand: np.ndarray,
    position: np.ndarray,
    paths: np.ndarray,
    w_ptr: np.ndarray,
    w_feature: np.ndarray,
    w_val: np.ndarray,
    bias: np.ndarray,
    f_ptr: np.ndarray,
    f_child: np.ndarray,
    f_val: np.ndarray,
    n_inner: int,
    f_slot: np.ndarray,
    f_dense: np.ndarray,
    n_features: int,
    n_chunks: int,
) -> np.ndarray:
    """Per row of ``q`` (unit values, features ascending, below ``n_features``) and
    candidate label ``cand[i, j]`` (-1: none, 0 out): the sum of ``max(0, 1 - margin)^2``
    over the classifiers on the label's path: the children ``paths[position[label]]``
    (:func:`child_paths`; ``position`` -1: not in the tree), child ``c`` of weights
    ``w_feature/w_val[w_ptr[c]:w_ptr[c+1]]`` and bias ``bias[c]``. The ``n_inner``
    children above the leaves are also given by feature (``f_ptr``, ``f_child``,
    ``f_val``: their CSR transposed, less the features of the rows of ``f_dense`` that
    ``f_slot`` names, :func:`~dslide_dask.kernels.tree_inner.dense_features`): a row
    computes their margins all at once."""
    n, m = cand.shape
    n_levels = paths.shape[1]
    out = np.zeros((n, m), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for chunk in numba.prange(n_chunks):
        loss_of = np.empty(n_inner, np.float32)
        dense = np.zeros(n_features, np.float32)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            for q in range(lo, hi):
                dense[q_idx[q]] = q_val[q]
            inner_losses(q_idx, q_val, lo, hi, bias, f_ptr, f_child, f_val, f_slot, f_dense,
                         loss_of)  # fmt: skip
            for j in range(m):
                lab = cand[i, j]
                if lab < 0:
                    continue
                if lab >= position.shape[0] or position[lab] < 0:
                    out[i, j] = UNSEEN
                    continue
                path = paths[position[lab]]
                c = path[n_levels - 1]
                z = bias[c] + _margin(
                    dense, q_idx, q_val, lo, hi, w_feature, w_val, w_ptr[c], w_ptr[c + 1]
                )
                out[i, j] = above_leaf(loss_of, path) + hinge(z)
            for q in range(lo, hi):
                dense[q_idx[q]] = 0.0
    return out


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def bounded_losses(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    cand: np.ndarray,
    scores: np.ndarray,
    power: float,
    k: int,
    position: tuple,
    paths: tuple,
    w_ptr: tuple,
    w_feature: tuple,
    w_val: tuple,
    bias: tuple,
    f_ptr: tuple,
    f_child: tuple,
    f_val: tuple,
    n_inner: tuple,
    n_features: int,
    n_chunks: int,
    min_rows: int,
    f_slot: tuple,
    f_dense: tuple,
    hot: tuple,
) -> np.ndarray:
    """:func:`path_losses` averaged over the trees of the tuples given (one entry a tree),
    for the candidates that can still be among a row's ``k`` best by ``scores[i, j] *
    exp(-power * loss)``; the others get ``inf``. A candidate's classifiers above the
    leaves bound its score from above (a leaf's loss is at least 0), so its leaf
    classifiers are scored in the order of that bound until the bound falls below the
    ``k``-th best score found (by a margin for rounding): the ``k`` best are those of
    every loss computed, for half the leaf classifiers' work (amazon-670k). A leaf
    classifier that ``min_rows`` rows of the batch or more name is scored for all of them
    at once, its weights read once (:mod:`~dslide_dask.kernels.shared_dots`). The
    classifiers above the leaves are given by feature (``f_*``, the dense rows of
    ``f_slot``'s features in ``f_dense``), and so are the longest leaf classifiers
    (``hot``: each array of :func:`~dslide_dask.kernels.tree_inner.hot_leaves` as a tuple
    over the trees), scored with them for every row."""
    n, m = cand.shape
    n_trees = len(position)
    inner, bound, leaf = _bounds(q_ptr, q_idx, q_val, cand, scores, power, position, paths,
                                 bias, f_ptr, f_child, f_val, f_slot, f_dense, n_inner, hot,
                                 n_chunks)  # fmt: skip
    shared = np.full((n_trees, n, m), np.nan, np.float32)  # NaN: not scored yet
    named = bound.reshape(n * m) > -np.inf
    for t in range(n_trees if n >= min_rows else 0):  # the leaves named by rows enough
        pairs = np.flatnonzero(named & (leaf[t].reshape(n * m) >= 0))
        got = shared_dots(q_ptr, q_idx, q_val, pairs // m, leaf[t].reshape(n * m)[pairs],
                          w_ptr[t], w_feature[t], w_val[t], n_features, min_rows,
                          n_chunks)  # fmt: skip
        shared[t].reshape(n * m)[pairs] = got
    out = np.full((n, m), np.inf, np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for chunk in numba.prange(n_chunks):
        dense = np.zeros(n_features, np.float32)
        best = np.empty(max(k, 1), np.float32)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            for q in range(lo, hi):
                dense[q_idx[q]] = q_val[q]
            best[:] = -np.inf
            for j in range(m):
                if cand[i, j] < 0:
                    out[i, j] = 0.0
            order = np.argsort(-bound[i])
            for n_seen, j in enumerate(order):  # n_seen: losses computed
                if bound[i, j] == -np.inf:
                    break
                if n_seen >= k and bound[i, j] < best[k - 1] * (1.0 - 1e-5):
                    break
                if n_seen + AHEAD < m:  # the leaves a few candidates on: cold, asked for
                    _prefetch_leaves(i, order[n_seen + AHEAD], leaf, shared, w_ptr, w_feature,
                                     w_val)  # fmt: skip
                total = np.float32(0.0)
                for t in range(n_trees):
                    loss = inner[t, i, j]
                    c = leaf[t, i, j]
                    if c >= 0:
                        z = shared[t, i, j]
                        if np.isnan(z):
                            wp = w_ptr[t]
                            z = _margin(dense, q_idx, q_val, lo, hi, w_feature[t], w_val[t],
                                        wp[c], wp[c + 1])  # fmt: skip
                        loss += hinge(bias[t][c] + z)
                    total += loss
                total = total / np.float32(n_trees)
                out[i, j] = total
                final = scores[i, j] * np.exp(-power * total)
                if final > best[k - 1]:  # the k best so far, descending
                    at = k - 1
                    while at > 0 and best[at - 1] < final:
                        best[at] = best[at - 1]
                        at -= 1
                    best[at] = final
            for q in range(lo, hi):
                dense[q_idx[q]] = 0.0
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _prefetch_leaves(i, j, leaf, shared, w_ptr, w_feature, w_val) -> None:
    """Ask the cache for the first lines of candidate ``(i, j)``'s leaf classifiers that
    are still to be gathered (not shared)."""
    for t in range(len(w_ptr)):
        c = leaf[t, i, j]
        if c >= 0 and np.isnan(shared[t, i, j]):
            wp = w_ptr[t]
            prefetch_run(w_feature[t], wp[c], wp[c + 1], PREFETCH_LINES)
            prefetch_run(w_val[t], wp[c], wp[c + 1], PREFETCH_LINES)


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def _bounds(q_ptr, q_idx, q_val, cand, scores, power, position, paths, bias, f_ptr, f_child,
            f_val, f_slot, f_dense, n_inner, hot, n_chunks):  # fmt: skip
    """``(inner, bound, leaf)``: each candidate's loss above the leaves in each tree, and
    its hot leaf's (:data:`UNSEEN` where not in it), the bound on its score that gives
    (-inf: no candidate), and its leaf classifier still to score in each tree (-1: none)."""
    n, m = cand.shape
    n_trees = len(position)
    offset = np.zeros(2 * n_trees + 1, np.int64)  # each tree's inner, then hot, losses
    for t in range(n_trees):
        offset[2 * t + 1] = offset[2 * t] + n_inner[t]
        offset[2 * t + 2] = offset[2 * t + 1] + hot[5][t].shape[0]
    h_ptr, h_col, h_val, h_slot, h_dense, h_bias, col_of = hot
    inner = np.empty((n_trees, n, m), np.float32)
    bound = np.empty((n, m), np.float32)
    leaf = np.full((n_trees, n, m), -1, np.int32)
    n_chunks = max(1, min(n, n_chunks))
    for chunk in numba.prange(n_chunks):
        loss_of = np.empty(offset[2 * n_trees], np.float32)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            for t in range(n_trees):
                inner_losses(q_idx, q_val, lo, hi, bias[t], f_ptr[t], f_child[t], f_val[t],
                             f_slot[t], f_dense[t],
                             loss_of[offset[2 * t] : offset[2 * t + 1]])  # fmt: skip
                inner_losses(q_idx, q_val, lo, hi, h_bias[t], h_ptr[t], h_col[t], h_val[t],
                             h_slot[t], h_dense[t],
                             loss_of[offset[2 * t + 1] : offset[2 * t + 2]])  # fmt: skip
            for j in range(m):
                lab = cand[i, j]
                if lab < 0:
                    inner[:, i, j] = 0.0
                    bound[i, j] = -np.inf
                    continue
                mean = np.float32(0.0)
                for t in range(n_trees):
                    pos = position[t]
                    if lab >= pos.shape[0] or pos[lab] < 0:
                        inner[t, i, j] = UNSEEN
                    else:
                        path = paths[t][pos[lab]]
                        s = above_leaf(loss_of[offset[2 * t] : offset[2 * t + 1]], path)
                        c = path[path.shape[0] - 1]
                        col = col_of[t][c]
                        if col >= 0:  # its leaf's loss known too
                            s += loss_of[offset[2 * t + 1] + col]
                        else:
                            leaf[t, i, j] = c
                        inner[t, i, j] = s
                    mean += inner[t, i, j]
                s = scores[i, j]
                # leaf losses >= 0: s * exp(-power * loss) <= this (<= 0 where s < 0)
                bound[i, j] = s * np.exp(-power * mean / n_trees) if s >= 0 else 0.0
    return inner, bound, leaf

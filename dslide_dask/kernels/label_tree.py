"""A label tree over sparse rows: labels split in halves by their centroids, a linear
classifier for every child of every classifier node, and the tree's score of candidates.

Labels sit in tree order (``perm``): every node is a range of positions, split at its
middle. :func:`split_level` orders each node's labels so the first half is one cluster of
a balanced spherical 2-means over their centroids, the second the other (as Parabel and
PECOS cluster). :func:`train_node` trains a node's children's classifiers on the node's
rows (those with a label under it: each child's positives, the others' negatives) with
the label classifiers' solver, :func:`~dslide_dask.kernels.label_svm.dcd_pass`.
:func:`~dslide_dask.kernels.tree_query.path_losses` sums, for each candidate label of a
row, the squared hinge losses of the classifiers on its path: ``exp(-loss)`` is the
tree's likelihood of the label.
"""

import numba
import numpy as np

from dslide_dask.kernels.label_centroids import _label_sum
from dslide_dask.kernels.label_svm import dcd_block, dcd_pass


@numba.njit(cache=True, nogil=True)
def _mix(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a deterministic pseudo-random number from ``x``."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _centre(members, c_ptr, c_idx, c_val, acc, touched) -> int:
    """The unit-norm sum of the centroids ``members`` into ``acc`` (dense, zero where
    untouched); the number of features listed in ``touched``."""
    n, scale = _label_sum(members, c_ptr, c_idx, c_val, acc, touched)
    for t in range(n):
        acc[touched[t]] *= np.float32(scale)
    return n


@numba.njit(cache=True, nogil=True)
def _localised(members, c_ptr, c_idx, c_val, local, features):
    """The centroids ``members`` as CSR over their own features, numbered from 0 in the
    order first met (``features[:n]`` their global ids; ``local``, -1 per feature, is
    left as found): a small node's centres then fit in cache."""
    size = members.shape[0]
    l_ptr = np.zeros(size + 1, np.int64)
    for m in range(size):
        l_ptr[m + 1] = l_ptr[m] + c_ptr[members[m] + 1] - c_ptr[members[m]]
    l_idx = np.empty(l_ptr[size], np.int32)
    l_val = np.empty(l_ptr[size], np.float32)
    n = 0
    for m in range(size):
        shift = l_ptr[m] - c_ptr[members[m]]
        for e in range(c_ptr[members[m]], c_ptr[members[m] + 1]):
            f = c_idx[e]
            if local[f] < 0:
                local[f] = n
                features[n] = f
                n += 1
            l_idx[e + shift] = local[f]
            l_val[e + shift] = c_val[e]
    for t in range(n):
        local[features[t]] = -1
    return l_ptr, l_idx, l_val, n


@numba.njit(cache=True, nogil=True)
def _gaps(own, l_ptr, l_idx, l_val, centre, gap) -> None:
    """The dot product of centroid ``own[i]`` with the dense ``centre``, into ``gap[i]``."""
    for i in range(own.shape[0]):
        m = own[i]
        g = np.float32(0.0)
        for e in range(l_ptr[m], l_ptr[m + 1]):
            g += l_val[e] * centre[l_idx[e]]
        gap[i] = g


@numba.njit(cache=True, nogil=True)
def _towards(own, half, l_ptr, l_idx, l_val, total, first, towards) -> None:
    """``c1 - c0`` for the unit-norm sums ``c0`` of the centroids ``own[:half]`` and
    ``c1`` of the rest, into ``towards``; ``total`` is the sum of all of them, so the
    second half's sum is ``total - first`` and costs no pass over its centroids."""
    first[:] = 0.0
    for i in range(half):
        m = own[i]
        for e in range(l_ptr[m], l_ptr[m + 1]):
            first[l_idx[e]] += l_val[e]
    norm0 = 0.0
    norm1 = 0.0
    for f in range(first.shape[0]):
        rest = total[f] - first[f]
        norm0 += first[f] * first[f]
        norm1 += rest * rest
    s0 = np.float32(1.0 / np.sqrt(norm0) if norm0 > 0.0 else 0.0)
    s1 = np.float32(1.0 / np.sqrt(norm1) if norm1 > 0.0 else 0.0)
    for f in range(first.shape[0]):
        towards[f] = s1 * (total[f] - first[f]) - s0 * first[f]


@numba.njit(cache=True, nogil=True, parallel=True)
def split_level(
    c_ptr: np.ndarray,
    c_idx: np.ndarray,
    c_val: np.ndarray,
    perm: np.ndarray,
    bounds: np.ndarray,
    n_features: int,
    iterations: int,
    seed: int,
    n_chunks: int,
) -> None:
    """Order the labels of each node ``perm[bounds[j]:bounds[j+1]]`` (in place) so its
    first half (``(size) // 2`` labels) is one cluster, the rest the other: a balanced
    spherical 2-means over the labels' centroids (CSR ``c_*``, unit rows), started from a
    member picked by ``seed`` and the node and the member least like it, labels ranked
    by how much nearer the second centre they lie, for at most ``iterations`` rounds: a
    round that leaves the halves as they were would repeat itself, so the split stops
    there. Nodes are independent: the result does not depend on threads."""
    n_nodes = bounds.shape[0] - 1
    n_chunks = max(1, min(n_nodes, n_chunks))
    for chunk in numba.prange(n_chunks):
        local = np.full(n_features, -1, np.int32)
        features = np.empty(n_features, np.int32)
        for j in range(chunk * n_nodes // n_chunks, (chunk + 1) * n_nodes // n_chunks):
            lo, hi = bounds[j], bounds[j + 1]
            size = hi - lo
            if size < 2:
                continue
            half = size // 2
            members = perm[lo:hi].copy()
            l_ptr, l_idx, l_val, n = _localised(members, c_ptr, c_idx, c_val, local, features)
            c0 = np.zeros(n, np.float32)
            c1 = np.zeros(n, np.float32)
            towards = np.empty(n, np.float32)
            touched = np.empty(n, np.int64)
            own = np.arange(size)
            r = _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(j))
            a = np.int64(r % np.uint64(size))
            _centre(own[a : a + 1], l_ptr, l_idx, l_val, c0, touched)
            gap = np.empty(size, np.float32)
            _gaps(own, l_ptr, l_idx, l_val, c0, gap)  # the second centre: the least like it
            b = np.argmin(gap)
            _centre(own[b : b + 1], l_ptr, l_idx, l_val, c1, touched)
            for f in range(n):
                towards[f] = c1[f] - c0[f]
            total = np.zeros(n, np.float32)  # the node's sum; c0 holds a half's from now on
            for e in range(l_ptr[size]):
                total[l_idx[e]] += l_val[e]
            side = np.full(size, -1, np.int8)  # each member's half after the last round
            for _ in range(iterations):
                _gaps(own, l_ptr, l_idx, l_val, towards, gap)
                own = own[np.argsort(gap, kind="mergesort")]
                moved = False
                for i in range(size):
                    now = np.int8(i >= half)
                    if side[own[i]] != now:
                        side[own[i]] = now
                        moved = True
                if not moved:
                    break
                _towards(own, half, l_ptr, l_idx, l_val, total, c0, towards)
            perm[lo:hi] = members[own]


@numba.njit(cache=True, nogil=True)
def train_node(
    ptr: np.ndarray,
    idx: np.ndarray,
    val: np.ndarray,
    sq_norms: np.ndarray,
    label_ptr: np.ndarray,
    label_rows: np.ndarray,
    perm: np.ndarray,
    children: np.ndarray,
    passes: int,
    C: float,
    prune: float,
    seed: int,
    n_blocks: int,
    row_local: np.ndarray,
    feature_local: np.ndarray,
):
    """The classifiers of one node's children, child ``k`` being the labels
    ``perm[children[k]:children[k+1]]``, trained on the rows holding any of them (rows
    ``ptr/idx/val`` with unit values; a label's rows ``label_rows[label_ptr[l]:...]``).
    ``row_local`` (-1 per row) and ``feature_local`` (-1 per feature) are scratch, left
    as found. Returns each child's weights above ``prune`` (``w_feature/w_val[w_ptr[k]:
    w_ptr[k+1]]``, features ascending, global ids) and the children's biases."""
    K = children.shape[0] - 1
    lo, hi = children[0], children[-1]
    n_pairs = 0
    for p in range(lo, hi):
        n_pairs += label_ptr[perm[p] + 1] - label_ptr[perm[p]]
    rows = np.empty(n_pairs, np.int64)
    pair_row = np.empty(n_pairs, np.int64)
    pair_child = np.empty(n_pairs, np.int64)
    n_rows = 0
    e = 0
    for k in range(K):
        for p in range(children[k], children[k + 1]):
            lab = perm[p]
            for q in range(label_ptr[lab], label_ptr[lab + 1]):
                r = label_rows[q]
                if row_local[r] < 0:
                    row_local[r] = n_rows
                    rows[n_rows] = r
                    n_rows += 1
                pair_row[e] = row_local[r]
                pair_child[e] = k
                e += 1
    rows = rows[:n_rows]
    y_ptr = np.zeros(n_rows + 1, np.int64)
    for q in range(n_pairs):
        y_ptr[pair_row[q] + 1] += 1
    for i in range(n_rows):
        y_ptr[i + 1] += y_ptr[i]
    fill = y_ptr[:-1].copy()
    y_idx = np.empty(n_pairs, np.int64)
    for q in range(n_pairs):
        y_idx[fill[pair_row[q]]] = pair_child[q]
        fill[pair_row[q]] += 1
    # the node's rows over its own features
    l_ptr = np.zeros(n_rows + 1, np.int64)
    for i in range(n_rows):
        l_ptr[i + 1] = l_ptr[i] + ptr[rows[i] + 1] - ptr[rows[i]]
    l_idx = np.empty(l_ptr[-1], np.int64)
    l_val = np.empty(l_ptr[-1], np.float32)
    l_sq = np.empty(n_rows, np.float32)
    features = np.empty(l_ptr[-1], np.int64)
    n_feat = 0
    for i in range(n_rows):
        r = rows[i]
        l_sq[i] = sq_norms[r]
        for q in range(ptr[r], ptr[r + 1]):
            f = idx[q]
            if feature_local[f] < 0:
                feature_local[f] = n_feat
                features[n_feat] = f
                n_feat += 1
            l_idx[l_ptr[i] + q - ptr[r]] = feature_local[f]
            l_val[l_ptr[i] + q - ptr[r]] = val[q]
    features = features[:n_feat]
    W = np.zeros((n_feat, K), np.float32)
    bias = np.zeros(K, np.float32)
    alpha = np.zeros((n_rows, K), np.float32)
    order = np.arange(n_rows)
    state = np.uint64(seed)
    for _ in range(passes):
        for a in range(n_rows - 1, 0, -1):  # Fisher-Yates, numbers from _mix
            state = _mix(state + np.uint64(0x9E3779B97F4A7C15))
            b = np.int64(state % np.uint64(a + 1))
            order[a], order[b] = order[b], order[a]
        if n_blocks > 1:
            dcd_pass(l_ptr, l_idx, l_val, l_sq, y_ptr, y_idx, order, W, bias, alpha, C, n_blocks)
        else:  # on this thread alone: threads of the caller's may train other nodes
            dcd_block(l_ptr, l_idx, l_val, l_sq, y_ptr, y_idx, order, W, bias, alpha, C, 0, K)
    for i in range(n_rows):
        row_local[rows[i]] = -1
    by_feature = np.argsort(features)
    w_ptr = np.zeros(K + 1, np.int64)
    for k in range(K):
        kept = 0
        for j in range(n_feat):
            kept += abs(W[by_feature[j], k]) > prune
        w_ptr[k + 1] = w_ptr[k] + kept
    w_feature = np.empty(w_ptr[-1], np.int32)
    w_val = np.empty(w_ptr[-1], np.float32)
    for k in range(K):
        e = w_ptr[k]
        for j in range(n_feat):
            w = W[by_feature[j], k]
            if abs(w) > prune:
                w_feature[e] = features[by_feature[j]]
                w_val[e] = w
                e += 1
    for f in features:
        feature_local[f] = -1
    return w_ptr, w_feature, w_val, bias

"""Votes of the training points nearest a query in the network's hidden space.

The hidden vectors are dense: a block of queries is scored against every point by one
matrix product (:func:`dense_neighbour_votes` takes the similarities), or against the few
points an approximate search proposes (:func:`candidate_neighbour_votes` scores them
here). Either similarity can have the input's cosine mixed in (:func:`add_cosines`, or the
``other`` similarities of the candidates), so a point near in both spaces is nearer.
"""

import numba
import numpy as np

from dslide_dask.kernels.neighbours import (
    _accumulate,
    _dense,
    _scan_top,
    _touch,
    _vote,
    _vote_scratch,
)
from dslide_dask.kernels.topk import _push


@numba.njit(cache=True, nogil=True, parallel=True)
def dense_neighbour_votes(
    sims: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    k: int,
    m: int,
    n_chunks: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`neighbour_votes` from a dense block of similarities, ``sims[i, p]`` of query
    ``i`` and training point ``p`` (points of similarity <= 0 do not vote)."""
    n, n_points = sims.shape
    ids = np.full((n, m), -1, np.int64)
    shares = np.zeros((n, m), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        nb_ids, nb_sims, scratch = _vote_scratch(y_ptr, k, m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            _scan_top(sims[i], nb_ids, nb_sims)
            _vote(nb_ids, nb_sims, y_ptr, y_idx, scratch, ids[i], shares[i])
    return ids, shares


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def candidate_neighbour_votes(
    query: np.ndarray,
    points: np.ndarray,
    candidates: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    k: int,
    m: int,
    other: np.ndarray,
    mix: float,
    n_chunks: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dense_neighbour_votes` over each query's ``candidates[i]`` only (point ids,
    -1: none, a point at most once), their similarities ``(1 - mix) * query[i] @
    points[p] + mix * other[i, j]`` computed here: what an approximate search proposes,
    scored exactly (``other``: another similarity of the candidates, the input's)."""
    n, n_cand = candidates.shape
    ids = np.full((n, m), -1, np.int64)
    shares = np.zeros((n, m), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        nb_ids, nb_sims, scratch = _vote_scratch(y_ptr, k, m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            nb_ids[:] = -1
            nb_sims[:] = -np.inf
            for j in range(n_cand):
                pt = candidates[i, j]
                if pt < 0:
                    continue
                s = np.float32(0.0)  # float32 lanes: the dot product runs as SIMD
                for d in range(query.shape[1]):
                    s += query[i, d] * points[pt, d]
                s = (1.0 - mix) * s + mix * other[i, j]
                if s > 0.0 and s > nb_sims[k - 1]:
                    _push(nb_ids, nb_sims, pt, s)
            _vote(nb_ids, nb_sims, y_ptr, y_idx, scratch, ids[i], shares[i])
    return ids, shares


@numba.njit(cache=True, nogil=True, parallel=True)
def add_cosines(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    post_ptr: np.ndarray,
    post_pts: np.ndarray,
    post_val: np.ndarray,
    out: np.ndarray,
    scale: float,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    k: int,
    m: int,
    n_chunks: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """``out[i, p] += scale * cosine(query i, point p)`` for every point sharing a
    feature with the query (queries in CSR with normalised values, points as postings);
    with ``k`` > 0, also the input's votes of each query, as
    :func:`~dslide_dask.kernels.neighbours.neighbour_votes` gives them through every
    posting (the same cosines, summed once for both; ``k`` 0: ids -1)."""
    n, n_points = q_ptr.shape[0] - 1, out.shape[1]
    ids = np.full((n, m), -1, np.int64)
    shares = np.zeros((n, m), np.float32)
    weight = np.float32(scale)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        acc = np.zeros(n_points, np.float32)
        seen = np.zeros(n_points, np.bool_)
        touched = np.empty(n_points, np.int32)
        sims = np.empty(n_points, np.float32)
        nb_ids, nb_sims, scratch = _vote_scratch(y_ptr, max(k, 1), m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            row = out[i]
            if _dense(q_idx[lo:hi], post_ptr, n_points):
                _accumulate(q_idx[lo:hi], q_val[lo:hi], post_ptr, post_pts, post_val, acc, 1.0)
                if k > 0:
                    _scan_top(acc, nb_ids, nb_sims)
                for p in range(n_points):
                    row[p] += weight * acc[p]
                    acc[p] = 0.0
            else:
                n_touched = _touch(q_idx[lo:hi], q_val[lo:hi], post_ptr, post_pts, post_val,
                                   acc, seen, touched)  # fmt: skip
                for t in range(n_touched):
                    pt = touched[t]
                    sims[t] = acc[pt]
                    row[pt] += weight * acc[pt]
                    acc[pt] = 0.0
                    seen[pt] = False
                if k > 0:
                    _scan_top(sims[:n_touched], nb_ids, nb_sims)
                    for j in range(nb_ids.shape[0]):
                        if nb_ids[j] >= 0:
                            nb_ids[j] = touched[nb_ids[j]]
            if k > 0:
                _vote(nb_ids, nb_sims, y_ptr, y_idx, scratch, ids[i], shares[i])
    return ids, shares

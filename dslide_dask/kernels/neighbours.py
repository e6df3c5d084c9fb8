"""Nearest training points of sparse queries, and the labels they vote for.

A label seen on two training points has, in a 128-wide network, an output row that took
a handful of Adam steps; its two points, though, are still there. These kernels score a
query against every training point through an inverted index (feature -> points holding
it, with their values), keep the ``k`` most similar points, and let each vote for its
labels with its similarity. Both inputs are L2-normalised, so a similarity is a cosine.
The same votes come from dense similarities (:func:`dense_neighbour_votes`: the network's
hidden vectors, scored against the training points' by a matrix product beforehand), or
from the points an approximate search proposes (:func:`candidate_neighbour_votes`, which
scores them exactly); :mod:`dslide_dask.kernels.fusion` mixes such candidate lists.
"""

import numba
import numpy as np

from dslide_dask.kernels.topk import _push

#: A query's postings reaching more than 1 / DENSE_REACH of the points are summed into
#: the accumulator without tracking which points they touched, which is then scanned
#: whole: a branch and a list append per posting cost more than a pass over every point.
DENSE_REACH = 8
#: Points :func:`_scan_top` checks at once.
SCAN_BLOCK = 32


@numba.njit(cache=True, nogil=True)
def _neighbours_of_row(
    q_idx, q_val, post_ptr, post_pts, post_val, acc, seen, touched, nb_ids, nb_sims
) -> None:
    """Fill ``nb_ids``/``nb_sims`` (descending, -1 past the last; the lower point first on
    a tie when the scan is dense) with the points most similar to one query; ``acc`` and
    ``seen`` are zeroed scratch over points, zeroed again on return."""
    if _dense(q_idx, post_ptr, acc.shape[0]):
        for j in range(q_idx.shape[0]):
            f = q_idx[j]
            v = q_val[j]
            for p in range(post_ptr[f], post_ptr[f + 1]):
                acc[post_pts[p]] += v * post_val[p]
        _scan_top(acc, nb_ids, nb_sims)
        acc[:] = 0.0
        return
    nb_ids[:] = -1
    nb_sims[:] = -np.inf
    n_touched = 0
    for j in range(q_idx.shape[0]):
        f = q_idx[j]
        v = q_val[j]
        for p in range(post_ptr[f], post_ptr[f + 1]):
            pt = post_pts[p]
            if not seen[pt]:
                seen[pt] = True
                touched[n_touched] = pt
                n_touched += 1
            acc[pt] += v * post_val[p]
    for t in range(n_touched):
        pt = touched[t]
        s = acc[pt]
        acc[pt] = 0.0
        seen[pt] = False
        if s > 0.0:
            _push(nb_ids, nb_sims, pt, s)


@numba.njit(cache=True, nogil=True)
def _dense(q_idx, post_ptr, n_points: int) -> bool:
    """Whether a query's postings reach enough points to sum them densely."""
    reach = 0
    for j in range(q_idx.shape[0]):
        reach += post_ptr[q_idx[j] + 1] - post_ptr[q_idx[j]]
    return reach * DENSE_REACH >= n_points


@numba.njit(cache=True, nogil=True)
def _scan_top(sims, nb_ids, nb_sims) -> None:
    """Fill ``nb_ids``/``nb_sims`` (descending, -1 past the last; the lower point first on
    a tie) with the points of highest ``sims[p]`` above 0. A block of points is read
    once without a branch per point (a loop the compiler vectorises) and walked only
    when one beats the top's last: 4x faster than a branch per point."""
    nb_ids[:] = -1
    nb_sims[:] = -np.inf
    last = nb_sims.shape[0] - 1
    n = sims.shape[0]
    for start in range(0, n, SCAN_BLOCK):
        stop = min(start + SCAN_BLOCK, n)
        bar = max(nb_sims[last], 0.0)
        above = False
        for pt in range(start, stop):
            above |= sims[pt] > bar
        if above:
            for pt in range(start, stop):
                if sims[pt] > 0.0 and sims[pt] > nb_sims[last]:
                    _push(nb_ids, nb_sims, pt, sims[pt])


@numba.njit(cache=True, nogil=True, parallel=True)
def neighbour_votes(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    post_ptr: np.ndarray,
    post_pts: np.ndarray,
    post_val: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    n_labels: int,
    k: int,
    power: float,
    m: int,
    n_chunks: int = 64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each query row, the ``m`` labels its ``k`` nearest training points vote for
    most, with their share of the vote (similarity ** ``power``, normalised to sum to 1
    over the neighbours): ids (-1 where fewer) and shares, best first; and those ``k``
    points (-1 where fewer), nearest first.

    Queries in CSR (``q_*``), training points as an inverted index (``post_*``: CSC of the
    training matrix), their labels in CSR (``y_*``). Rows are processed in parallel, in
    ``n_chunks`` chunks that each own an accumulator over points and one over labels."""
    n = q_ptr.shape[0] - 1
    n_points = y_ptr.shape[0] - 1
    ids = np.full((n, m), -1, np.int64)
    shares = np.zeros((n, m), np.float32)
    points = np.full((n, k), -1, np.int64)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        acc = np.zeros(n_points, np.float32)
        seen = np.zeros(n_points, np.bool_)
        touched = np.empty(n_points, np.int32)
        nb_ids, nb_sims, scratch = _vote_scratch(n_labels, k, m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            _neighbours_of_row(
                q_idx[lo:hi],
                q_val[lo:hi],
                post_ptr,
                post_pts,
                post_val,
                acc,
                seen,
                touched,
                nb_ids,
                nb_sims,
            )
            _vote(nb_ids, nb_sims, power, y_ptr, y_idx, scratch, ids[i], shares[i])
            points[i] = nb_ids
    return ids, shares, points


@numba.njit(cache=True, nogil=True)
def _vote_scratch(n_labels: int, k: int, m: int):
    """A chunk's buffers: the neighbours (ids, similarities) and, for :func:`_vote`, the
    votes over labels (zeroed), the labels voted for and the running top ``m``."""
    scratch = (
        np.zeros(n_labels, np.float32),
        np.empty(n_labels, np.int32),
        np.empty(m, np.int64),
        np.empty(m, np.float32),
    )
    return np.empty(k, np.int64), np.empty(k, np.float32), scratch


@numba.njit(cache=True, nogil=True)
def _vote(nb_ids, nb_sims, power, y_ptr, y_idx, scratch, out_ids, out_shares):
    """The labels the neighbours (``nb_ids``, -1 past the last) vote for most into
    ``out_ids``/``out_shares`` (their share of the summed similarity ** ``power``);
    ``scratch`` is :func:`_vote_scratch`'s, its votes zeroed again on return."""
    votes, voted, top_ids, top_votes = scratch
    total = 0.0
    n_voted = 0
    for j in range(nb_ids.shape[0]):
        if nb_ids[j] < 0:
            break
        w = nb_sims[j] ** power
        total += w
        pt = nb_ids[j]
        for e in range(y_ptr[pt], y_ptr[pt + 1]):
            lab = y_idx[e]
            if votes[lab] == 0.0:
                voted[n_voted] = lab
                n_voted += 1
            votes[lab] += w
    top_ids[:] = -1
    top_votes[:] = -np.inf
    for t in range(n_voted):
        lab = voted[t]
        _push(top_ids, top_votes, lab, votes[lab])
        votes[lab] = 0.0
    for j in range(out_ids.shape[0]):
        if top_ids[j] < 0:
            break
        out_ids[j] = top_ids[j]
        out_shares[j] = top_votes[j] / total


@numba.njit(cache=True, nogil=True, parallel=True)
def dense_neighbour_votes(
    sims: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    n_labels: int,
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
        nb_ids, nb_sims, scratch = _vote_scratch(n_labels, k, m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            _scan_top(sims[i], nb_ids, nb_sims)
            _vote(nb_ids, nb_sims, 1.0, y_ptr, y_idx, scratch, ids[i], shares[i])
    return ids, shares


@numba.njit(cache=True, nogil=True, parallel=True)
def candidate_neighbour_votes(
    query: np.ndarray,
    points: np.ndarray,
    candidates: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    n_labels: int,
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
        nb_ids, nb_sims, scratch = _vote_scratch(n_labels, k, m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            nb_ids[:] = -1
            nb_sims[:] = -np.inf
            for j in range(n_cand):
                pt = candidates[i, j]
                if pt < 0:
                    continue
                s = 0.0
                for d in range(query.shape[1]):
                    s += query[i, d] * points[pt, d]
                s = (1.0 - mix) * s + mix * other[i, j]
                if s > 0.0 and s > nb_sims[k - 1]:
                    _push(nb_ids, nb_sims, pt, s)
            _vote(nb_ids, nb_sims, 1.0, y_ptr, y_idx, scratch, ids[i], shares[i])
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
) -> None:
    """``out[i, p] += scale * cosine(query i, point p)`` for every point sharing a
    feature with the query (queries in CSR with normalised values, points as postings)."""
    for i in numba.prange(q_ptr.shape[0] - 1):
        for j in range(q_ptr[i], q_ptr[i + 1]):
            f = q_idx[j]
            v = scale * q_val[j]
            for p in range(post_ptr[f], post_ptr[f + 1]):
                out[i, post_pts[p]] += v * post_val[p]


@numba.njit(cache=True, nogil=True, parallel=True)
def candidate_cosines(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    post_ptr: np.ndarray,
    post_pts: np.ndarray,
    post_val: np.ndarray,
    n_points: int,
    candidates: np.ndarray,
    n_chunks: int = 64,
) -> np.ndarray:
    """The cosine of query ``i`` and each point ``candidates[i, j]`` (-1: 0)."""
    n, n_cand = candidates.shape
    out = np.zeros((n, n_cand), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        acc = np.zeros(n_points, np.float32)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            _accumulate(q_idx[lo:hi], q_val[lo:hi], post_ptr, post_pts, post_val, acc, 1.0)
            for j in range(n_cand):
                if candidates[i, j] >= 0:
                    out[i, j] = acc[candidates[i, j]]
            if _dense(q_idx[lo:hi], post_ptr, n_points):
                acc[:] = 0.0
            else:
                _accumulate(q_idx[lo:hi], q_val[lo:hi], post_ptr, post_pts, post_val, acc, 0.0)
    return out


@numba.njit(cache=True, nogil=True)
def _accumulate(q_idx, q_val, post_ptr, post_pts, post_val, acc, keep: float) -> None:
    """``acc[p] = keep * acc[p] + keep * (query . point p)`` over the points sharing a
    feature with one query: 1 accumulates its cosines, 0 clears what it touched."""
    for j in range(q_idx.shape[0]):
        f = q_idx[j]
        for p in range(post_ptr[f], post_ptr[f + 1]):
            acc[post_pts[p]] = keep * (acc[post_pts[p]] + q_val[j] * post_val[p])


@numba.njit(cache=True, nogil=True)
def normalised(indptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` with each CSR row scaled to unit L2 norm (an all-zero row stays zero)."""
    out = np.empty(values.shape[0], np.float32)
    for i in range(indptr.shape[0] - 1):
        norm = 0.0
        for e in range(indptr[i], indptr[i + 1]):
            norm += values[e] * values[e]
        scale = 1.0 / np.sqrt(norm) if norm > 0.0 else 0.0
        for e in range(indptr[i], indptr[i + 1]):
            out[e] = values[e] * scale
    return out


@numba.njit(cache=True, nogil=True)
def postings(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, n_cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverted index of a CSR matrix with L2-normalised rows: per column, the rows
    holding it (ascending) and their normalised values (CSC)."""
    scaled = normalised(indptr, values)
    ptr = np.zeros(n_cols + 1, np.int64)
    for e in range(indices.shape[0]):
        ptr[indices[e] + 1] += 1
    for c in range(n_cols):
        ptr[c + 1] += ptr[c]
    fill = ptr[:-1].copy()
    pts = np.empty(indices.shape[0], np.int32)
    val = np.empty(indices.shape[0], np.float32)
    for i in range(indptr.shape[0] - 1):
        for e in range(indptr[i], indptr[i + 1]):
            c = indices[e]
            pts[fill[c]] = i
            val[fill[c]] = scaled[e]
            fill[c] += 1
    return ptr, pts, val

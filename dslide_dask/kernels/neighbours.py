"""Nearest training points of sparse queries, and the labels they vote for.

A label seen on two training points has, in a 128-wide network, an output row that took
a handful of Adam steps; its two points, though, are still there. These kernels score a
query against every training point through an inverted index (feature -> points holding
it, with their values), keep the ``k`` most similar points, and let each vote for its
labels with its similarity. Both inputs are L2-normalised, so a similarity is a cosine.
A served row may read part of the postings and score the points they find exactly from
the points' own rows (:func:`neighbour_votes`, :func:`row_cosines`).
:mod:`~dslide_dask.kernels.hidden_votes` gives the same votes in the network's hidden
space, :mod:`~dslide_dask.kernels.fusion` mixes such candidate lists.
"""

import numba
import numpy as np

from dslide_dask.kernels.prefetch import AHEAD, prefetch_row_read, prefetch_run
from dslide_dask.kernels.topk import _push, push_kept, scan_top

#: A query's postings reaching more than 1 / DENSE_REACH of the points are summed into
#: the accumulator without tracking which points they touched, which is then scanned
#: whole: a branch and a list append per posting cost more than a pass over every point.
DENSE_REACH = 8
#: Lines of a candidate's row :func:`row_cosines` asks for a few candidates ahead.
ROW_LINES = 4
#: Labels a neighbour's votes have room for in a chunk's scratch before a row takes more.
VOTE_ROOM = 16


@numba.njit(cache=True, nogil=True)
def _neighbours_of_row(
    q_idx, q_val, post_ptr, post_pts, post_val, acc, seen, touched, sims, nb_ids, nb_sims
) -> None:
    """Fill ``nb_ids``/``nb_sims`` (descending, -1 past the last; on a tie the lower point
    first when the scan is dense, else the one reached first) with the points most
    similar to one query; ``acc`` and ``seen`` are zeroed scratch over points, zeroed
    again on return, ``touched`` and ``sims`` scratch as long."""
    if _dense(q_idx, post_ptr, acc.shape[0]):
        _accumulate(q_idx, q_val, post_ptr, post_pts, post_val, acc, 1.0)
        _scan_top(acc, nb_ids, nb_sims)
        acc[:] = 0.0
        return
    n_touched = _touch(q_idx, q_val, post_ptr, post_pts, post_val, acc, seen, touched)
    for t in range(n_touched):  # the points reached, in a row the scan selects from
        pt = touched[t]
        sims[t] = acc[pt]
        acc[pt] = 0.0
        seen[pt] = False
    _scan_top(sims[:n_touched], nb_ids, nb_sims)
    for j in range(nb_ids.shape[0]):
        if nb_ids[j] >= 0:
            nb_ids[j] = touched[nb_ids[j]]


@numba.njit(cache=True, nogil=True)
def _touch(q_idx, q_val, post_ptr, post_pts, post_val, acc, seen, touched) -> int:
    """Sum one query's dot products with the points its postings reach into ``acc``,
    listing those points in ``touched`` (marked in ``seen``) as first reached; how many."""
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
    return n_touched


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
    a tie) with the points of highest ``sims[p]`` above 0."""
    scan_top(sims, nb_ids, nb_sims, 0.0)


@numba.njit(cache=True, nogil=True, parallel=True)
def neighbour_votes(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    post_ptr: np.ndarray,
    post_pts: np.ndarray,
    post_val: np.ndarray,
    common_slot: np.ndarray,
    common: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    k: int,
    m: int,
    n_cand: int,
    n_chunks: int = 64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each query row, the ``m`` labels its ``k`` nearest training points vote for
    most, with their share of the vote (similarity normalised to sum to 1 over the
    neighbours): ids (-1 where fewer) and shares, best first; and those ``k`` points (-1
    where fewer), nearest first.

    Queries in CSR (``q_*``), training points as an inverted index (``post_*``: CSC of the
    training matrix), their labels in CSR (``y_*``). ``n_cand`` 0: the neighbours are the
    nearest through the postings. Else the postings may leave features out (a served
    row's: the common ones, whose long lists cost a pass over every point while their
    small values barely move which points are nearest), and the neighbours are the ``k``
    most similar by the exact cosine of the ``n_cand`` the postings find most similar:
    their sum over the postings plus the left-out features' part, from ``common[p,
    common_slot[f]]`` (point p's value of left-out feature f; ``common_slot`` -1 for the
    others). Rows are processed in parallel, in ``n_chunks`` chunks that each own
    accumulators over points and labels."""
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
        sims = np.empty(n_points, np.float32)
        cand_ids = np.empty(max(n_cand, 1), np.int64)
        cand_sims = np.empty(max(n_cand, 1), np.float32)
        q_slots = np.empty(common.shape[1], np.int64)  # a row's left-out features
        q_vals = np.empty(common.shape[1], np.float32)
        nb_ids, nb_sims, scratch = _vote_scratch(y_ptr, k, m)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            found = (cand_ids, cand_sims) if n_cand else (nb_ids, nb_sims)
            _neighbours_of_row(
                q_idx[lo:hi],
                q_val[lo:hi],
                post_ptr,
                post_pts,
                post_val,
                acc,
                seen,
                touched,
                sims,
                *found,
            )
            if n_cand:
                n_q = 0
                for j in range(lo, hi):
                    if common_slot[q_idx[j]] >= 0:
                        q_slots[n_q] = common_slot[q_idx[j]]
                        q_vals[n_q] = q_val[j]
                        n_q += 1
                nb_ids[:] = -1
                nb_sims[:] = -np.inf
                for a in range(n_cand):
                    pt = cand_ids[a]
                    if pt < 0:
                        break
                    if n_q and a + AHEAD < n_cand and cand_ids[a + AHEAD] >= 0:
                        prefetch_row_read(common, cand_ids[a + AHEAD])
                    s = cand_sims[a]
                    for t in range(n_q):
                        s += q_vals[t] * common[pt, q_slots[t]]
                    if s > 0.0 and s > nb_sims[k - 1]:
                        _push(nb_ids, nb_sims, pt, s)
            _vote(nb_ids, nb_sims, y_ptr, y_idx, scratch, ids[i], shares[i])
            points[i] = nb_ids
    return ids, shares, points


@numba.njit(cache=True, nogil=True, parallel=True)
def row_cosines(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    row_ptr: np.ndarray,
    row_idx: np.ndarray,
    row_val: np.ndarray,
    candidates: np.ndarray,
    n_features: int,
    n_chunks: int = 64,
) -> np.ndarray:
    """The cosine of query ``i`` and each point ``candidates[i, j]`` (-1: 0), from the
    points' rows (as :func:`neighbour_votes`'): the query spread over ``n_features``, a
    gather a candidate's entry (its first lines asked for a few candidates ahead), no pass
    over postings."""
    n, n_cand = candidates.shape
    out = np.zeros((n, n_cand), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        query = np.zeros(n_features, np.float32)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            _spread(q_idx[lo:hi], q_val[lo:hi], query)
            for a in range(n_cand):
                pt = candidates[i, a]
                if a + AHEAD < n_cand and candidates[i, a + AHEAD] >= 0:  # cold: asked for
                    ahead = candidates[i, a + AHEAD]
                    prefetch_run(row_idx, row_ptr[ahead], row_ptr[ahead + 1], ROW_LINES)
                    prefetch_run(row_val, row_ptr[ahead], row_ptr[ahead + 1], ROW_LINES)
                if pt >= 0:
                    out[i, a] = _row_dot(query, row_idx, row_val, row_ptr[pt], row_ptr[pt + 1])
            query[q_idx[lo:hi]] = 0.0
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _spread(q_idx, q_val, query) -> None:
    """Add one sparse query into the dense ``query`` over features (zeros elsewhere)."""
    for j in range(q_idx.shape[0]):
        query[q_idx[j]] += q_val[j]


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def _row_dot(query, row_idx, row_val, start, stop):
    """The dense ``query`` times a point's row (its entries ``start:stop`` of ``row_*``):
    a gather over the row's entries, with no branch to mispredict as a merge of two sorted
    lists has (that merge was half a served row's input votes at 670K labels)."""
    s = np.float32(0.0)
    for e in range(start, stop):
        s += query[row_idx[e]] * row_val[e]
    return s


@numba.njit(cache=True, nogil=True)
def _vote_scratch(y_ptr: np.ndarray, k: int, m: int):
    """A chunk's buffers: the neighbours (ids, similarities) and, for :func:`_vote`, room
    for :data:`VOTE_ROOM` labels a point of ``k`` (label, similarity; :func:`_vote` takes
    more where its neighbours hold more) and the running top ``m``: a few hundred
    entries, not an array over the labels (at 670K labels, zeroing one took a served
    row's chunk 2.7 MB of writes), nor a pass over ``y_ptr`` for the most labels a
    point holds (6 us a served row at 50K points)."""
    room = max(k * VOTE_ROOM, 1)
    scratch = (
        np.empty(room, np.int64),
        np.empty(room, np.float32),
        np.empty(m, np.int64),
        np.empty(m, np.float32),
    )
    return np.empty(k, np.int64), np.empty(k, np.float32), scratch


@numba.njit(cache=True, nogil=True)
def _vote(nb_ids, nb_sims, y_ptr, y_idx, scratch, out_ids, out_shares):
    """The labels the neighbours (``nb_ids``, -1 past the last) vote for most into
    ``out_ids``/``out_shares`` (their share of the summed similarity); ``scratch`` is
    :func:`_vote_scratch`'s. A label's votes are summed in the neighbours' order, and
    labels enter the top ``m`` in the order they were first voted for (ties: the first
    voted first)."""
    labels, weights, top_ids, top_votes = scratch
    needed = 0
    for j in range(nb_ids.shape[0]):
        if nb_ids[j] < 0:
            break
        needed += y_ptr[nb_ids[j] + 1] - y_ptr[nb_ids[j]]
    if needed > labels.shape[0]:  # points with more labels than the room
        labels = np.empty(needed, np.int64)
        weights = np.empty(needed, np.float32)
    total = 0.0
    n_votes = 0
    for j in range(nb_ids.shape[0]):
        if nb_ids[j] < 0:
            break
        w = nb_sims[j]
        total += w
        pt = nb_ids[j]
        for e in range(y_ptr[pt], y_ptr[pt + 1]):
            labels[n_votes] = y_idx[e]
            weights[n_votes] = w
            n_votes += 1
    order = np.argsort(labels[:n_votes], kind="mergesort")  # stable: a label's in order
    first = np.empty(n_votes, np.int64)  # per label: where it was first voted, its sum
    sums = np.empty(n_votes, np.float32)
    n_labels = 0
    a = 0
    while a < n_votes:
        lab = labels[order[a]]
        first[n_labels] = order[a]
        s = np.float32(0.0)
        while a < n_votes and labels[order[a]] == lab:
            s += weights[order[a]]
            a += 1
        sums[n_labels] = s
        n_labels += 1
    top_ids[:] = -1
    top_votes[:] = -np.inf
    n_kept = 0
    for t in np.argsort(first[:n_labels]):  # in the order first voted for
        n_kept = push_kept(top_ids, top_votes, n_kept, labels[first[t]], sums[t])
    for j in range(out_ids.shape[0]):
        if top_ids[j] < 0:
            break
        out_ids[j] = top_ids[j]
        out_shares[j] = top_votes[j] / total


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
            else:  # only what the query touched
                for j in range(lo, hi):
                    acc[post_pts[post_ptr[q_idx[j]] : post_ptr[q_idx[j] + 1]]] = 0.0
    return out


@numba.njit(cache=True, nogil=True)
def _accumulate(q_idx, q_val, post_ptr, post_pts, post_val, acc, scale: float) -> None:
    """``acc[p] += scale * (query . point p)`` over the points sharing a feature with
    one query (its features ``q_idx``, values ``q_val``)."""
    for j in range(q_idx.shape[0]):
        f = q_idx[j]
        v = np.float32(scale * q_val[j])  # float32 products: no widening a posting
        for p in range(post_ptr[f], post_ptr[f + 1]):
            acc[post_pts[p]] += v * post_val[p]


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
    return transpose(indptr, indices, normalised(indptr, values), n_cols)


@numba.njit(cache=True, nogil=True)
def transpose(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, n_cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR matrix ``(indptr, indices, values)`` by columns: per column, the rows
    holding it (ascending, int32) and their values."""
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
            val[fill[c]] = values[e]
            fill[c] += 1
    return ptr, pts, val

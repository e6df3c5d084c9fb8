"""Candidate lists of labels mixed into one ranking, and the weights of the mix scored.

Each source (the network's softmax over its top labels, each list of neighbours' votes)
names a few candidates a row with a score; :func:`fuse` ranks the union by the weighted
sum of the scores (a label a source does not list scores 0 there), and
:func:`hits_by_rank` counts the right labels at each rank for a weighting without
sorting, which is what choosing the weights on held rows repeats many times.
"""

import numba
import numpy as np

from dslide_dask.kernels.topk import _push, push_kept

#: ``hits`` of :func:`hits_by_rank`: a candidate the weighting does not offer (only
#: sources it leaves unasked list it), passed over.
SKIP = 2


@numba.njit(cache=True, nogil=True, parallel=True)
def fuse(ids: tuple, scores: tuple, weights: np.ndarray, k: int):
    """Top-k of ``sum_s weights[s] * scores[s]`` per row over the union of the sources'
    candidate lists (``ids[s][i]``, -1: none; a label missing from a list scores 0 there):
    ``(n, k)`` ids (-1 where fewer) and scores (-inf there). The lists come as tuples of
    ``(n, m_s)`` arrays, each as wide as its own: stacking them into one padded array
    first cost a served row more than fusing it."""
    n_sources = len(ids)
    n = ids[0].shape[0]
    width = 0
    for src in range(n_sources):
        width += ids[src].shape[1]
    out_ids = np.full((n, k), -1, np.int64)
    out_scores = np.full((n, k), -np.inf, np.float32)
    for i in numba.prange(n):
        labels = np.empty(width, np.int64)
        values = np.empty(width, np.float32)
        n_found = 0
        for src in range(n_sources):
            row_ids, row_scores = ids[src][i], scores[src][i]
            for a in range(row_ids.shape[0]):
                if row_ids[a] >= 0:
                    labels[n_found] = row_ids[a]
                    values[n_found] = weights[src] * row_scores[a]
                    n_found += 1
        order = np.argsort(labels[:n_found])
        a = 0
        n_kept = 0
        while a < n_found:
            lab = labels[order[a]]
            total = 0.0
            while a < n_found and labels[order[a]] == lab:
                total += values[order[a]]
                a += 1
            n_kept = push_kept(out_ids[i], out_scores[i], n_kept, lab, total)
    return out_ids, out_scores


@numba.njit(cache=True, nogil=True, parallel=True)
def rescored_top(ids: np.ndarray, scores: np.ndarray, factors: np.ndarray, k: int):
    """The ``k`` best of each row's candidates (``ids``, -1: none) by ``scores * factors``
    (-inf where -1), the first on a tie, NaN last, and those products (float32): the head
    of numpy's stable argsort of the negated products, without a dozen small-array calls
    for a served row or a sort of its candidates."""
    n, m = ids.shape
    k = min(k, m)
    out_ids = np.empty((n, k), np.int64)
    out_scores = np.empty((n, k), np.float32)
    for i in numba.prange(n):
        top = np.empty(k, np.int64)  # positions in the row, best first
        value = np.empty_like(factors[i, :k])
        n_kept = 0
        for j in range(m):
            v = scores[i, j] * factors[i, j] if ids[i, j] >= 0 else -np.inf
            p = n_kept
            while p > 0 and _beats(v, value[p - 1]):
                p -= 1
            if p == k:
                continue
            n_kept = min(n_kept + 1, k)
            for q in range(n_kept - 1, p, -1):
                top[q] = top[q - 1]
                value[q] = value[q - 1]
            top[p] = j
            value[p] = v
        for j in range(k):
            out_ids[i, j] = ids[i, top[j]]
            out_scores[i, j] = value[j]
    return out_ids, out_scores


@numba.njit(cache=True, nogil=True)
def fill_short(ids: np.ndarray, scores: np.ndarray, rows: np.ndarray, labels: np.ndarray):
    """Rows ``rows`` of a top-k (``ids``, -1 past a row's answers; ``scores``) completed
    in place from ``labels`` in order, passing over those a row already answers. A label
    filled in scored nothing from the sources that ranked the row: it gets the row's
    lowest score, or 0 if lower."""
    k = ids.shape[1]
    for i in rows:
        n = 0
        while n < k and ids[i, n] >= 0:
            n += 1
        low = np.float32(0.0)
        if n > 0 and scores[i, n - 1] < low:
            low = scores[i, n - 1]
        for label in labels:
            if n == k:
                break
            answered = False
            for q in range(n):
                if ids[i, q] == label:
                    answered = True
                    break
            if not answered:
                ids[i, n] = label
                scores[i, n] = low
                n += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _beats(a, b) -> bool:
    """Whether ``a`` ranks before ``b`` (later in a list) in a descending stable sort
    that puts NaN last."""
    return a > b or (b != b and a == a)


@numba.njit(cache=True, nogil=True, parallel=True)
def hits_by_rank(values: np.ndarray, hits: np.ndarray, weights: np.ndarray, k: int):
    """Over rows, how many have a right label at each rank of their top ``k`` by
    ``sum_s weights[s] * values[s, i, j]``: ``hits[i, j]`` says whether candidate ``j``
    of row ``i`` is right (1), wrong (0), not offered under this weighting (:data:`SKIP`)
    or past the row's candidates (-1). One pass, no sort: what scoring a weight on held
    rows costs."""
    n_sources, n, width = values.shape
    per_row = np.zeros((n, k), np.int64)
    for i in numba.prange(n):
        top_hit = np.zeros(k, np.int64)
        top_score = np.full(k, -np.inf, np.float32)
        for j in range(width):
            if hits[i, j] < 0:
                break
            if hits[i, j] == SKIP:
                continue
            s = 0.0
            for src in range(n_sources):
                s += weights[src] * values[src, i, j]
            _push(top_hit, top_score, hits[i, j], s)
        per_row[i] = top_hit
    return per_row.sum(axis=0)

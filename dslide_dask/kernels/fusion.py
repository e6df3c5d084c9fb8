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
def fuse(ids: np.ndarray, scores: np.ndarray, weights: np.ndarray, k: int):
    """Top-k of ``sum_s weights[s] * scores[s]`` per row over the union of the sources'
    candidate lists (``ids[s, i]``, -1: none; a label missing from a list scores 0 there):
    ``(n, k)`` ids (-1 where fewer) and scores (-inf there)."""
    n_sources, n, m = ids.shape
    out_ids = np.full((n, k), -1, np.int64)
    out_scores = np.full((n, k), -np.inf, np.float32)
    for i in numba.prange(n):
        labels = np.empty(n_sources * m, np.int64)
        values = np.empty(n_sources * m, np.float32)
        n_found = 0
        for src in range(n_sources):
            for a in range(m):
                if ids[src, i, a] >= 0:
                    labels[n_found] = ids[src, i, a]
                    values[n_found] = weights[src] * scores[src, i, a]
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

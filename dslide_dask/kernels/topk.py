"""Top-k selection: streaming merge of score blocks, and top-k inside active sets."""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always")
def _push(ids: np.ndarray, scores: np.ndarray, cand: int, score: float) -> None:
    """Insert into a descending top-k row if it beats the last entry."""
    k = ids.shape[0]
    if score <= scores[k - 1]:
        return
    j = k - 1
    while j > 0 and scores[j - 1] < score:
        scores[j] = scores[j - 1]
        ids[j] = ids[j - 1]
        j -= 1
    scores[j] = score
    ids[j] = cand


@numba.njit(cache=True, nogil=True, parallel=True)
def merge_block(
    block: np.ndarray, block_ids: np.ndarray, top_ids: np.ndarray, top_scores: np.ndarray
) -> None:
    """Merge score columns ``block[:, j]`` (of neurons ``block_ids[j]``) into the running
    descending top-k ``top_ids``/``top_scores`` (initialise scores to -inf, ids to -1)."""
    n, width = block.shape
    for i in numba.prange(n):
        ids = top_ids[i]
        scores = top_scores[i]
        for j in range(width):
            _push(ids, scores, block_ids[j], block[i, j])


@numba.njit(cache=True, nogil=True, parallel=True)
def topk_of_active(
    logits: np.ndarray, active: np.ndarray, n_active: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The k best active neurons of each example (id -1 and score -inf where fewer)."""
    n = logits.shape[0]
    top_ids = np.full((n, k), -1, np.int64)
    top_scores = np.full((n, k), -np.inf, np.float32)
    for i in numba.prange(n):
        for j in range(n_active[i]):
            _push(top_ids[i], top_scores[i], active[i, j], logits[i, j])
    return top_ids, top_scores


@numba.njit(cache=True, nogil=True, parallel=True)
def lsh_topk(
    h: np.ndarray,
    W: np.ndarray,
    bias: np.ndarray,
    buckets: np.ndarray,
    table_ids: np.ndarray,
    table_counts: np.ndarray,
    n_tables: int,
    max_candidates: int,
    k: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Serving top-k: score only the neurons found in the first ``n_tables`` tables'
    buckets of each query ``h[i]`` (bucket ids ``buckets[i]``). With more than
    ``max_candidates`` (> 0) distinct neurons found, the ones found in the most tables
    are scored (ties: lower id). Returns ``(local ids, scores, candidates scored)``;
    ids -1 and scores -inf where fewer than k were found."""
    n = h.shape[0]
    dim = h.shape[1]
    cap = table_ids.shape[2]
    top_ids = np.full((n, k), -1, np.int64)
    top_scores = np.full((n, k), -np.inf, np.float32)
    n_scored = np.zeros(n, np.int32)
    for i in numba.prange(n):
        pool = np.empty(n_tables * cap, np.int32)
        m = 0
        for t in range(n_tables):
            b = buckets[i, t]
            for j in range(min(table_counts[t, b], cap)):
                pool[m] = table_ids[t, b, j]
                m += 1
        pool = np.sort(pool[:m])
        uniq = np.empty(m, np.int32)
        freq = np.empty(m, np.int32)
        u = 0
        for j in range(m):
            if u > 0 and uniq[u - 1] == pool[j]:
                freq[u - 1] += 1
            else:
                uniq[u] = pool[j]
                freq[u] = 1
                u += 1
        chosen = uniq[:u]
        if 0 < max_candidates < u:
            order = np.argsort(-freq[:u], kind="mergesort")[:max_candidates]
            chosen = uniq[order]
        n_scored[i] = chosen.shape[0]
        for c in chosen:
            score = bias[c]
            for d in range(dim):
                score += h[i, d] * W[c, d]
            _push(top_ids[i], top_scores[i], c, score)
    return top_ids, top_scores, n_scored

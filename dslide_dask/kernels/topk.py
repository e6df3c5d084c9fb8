"""Top-k selection: streaming merge of score blocks, and top-k inside active sets."""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always")
def _push(ids: np.ndarray, scores: np.ndarray, cand: int, score: float) -> None:
    """Insert into a descending top-k row if it beats the last entry."""
    k = ids.shape[0]
    if not score <= scores[k - 1]:  # a NaN too, as the last entry
        _insert(ids, scores, k - 1, cand, score)


@numba.njit(cache=True, nogil=True, inline="always")
def push_kept(ids: np.ndarray, scores: np.ndarray, n_kept: int, cand: int, score: float) -> int:
    """:func:`_push` into a top-k row of which only the first
    ``n_kept`` entries are filled (the rest -1 / -inf), walking from there rather than
    from the end: the same row (a row's 100 candidates pushed into a top 300 walked its
    empty end each time). Returns how many are filled after (all, once a NaN came: then
    as ``_push`` from the end)."""
    k = ids.shape[0]
    if n_kept < k and score > -np.inf:
        _insert(ids, scores, n_kept, cand, score)
        return n_kept + 1
    _push(ids, scores, cand, score)
    return k if score != score else n_kept


@numba.njit(cache=True, nogil=True, inline="always")
def _insert(ids: np.ndarray, scores: np.ndarray, j: int, cand: int, score: float) -> None:
    """Put ``(cand, score)`` in a descending row at its place at or before ``j``, the
    entries from there to ``j - 1`` moving one on (entry ``j`` is overwritten)."""
    while j > 0 and scores[j - 1] < score:
        scores[j] = scores[j - 1]
        ids[j] = ids[j - 1]
        j -= 1
    scores[j] = score
    ids[j] = cand


#: Scores :func:`scan_top` and :func:`merge_tile` compare at once.
SCAN_BLOCK = 32


@numba.njit(cache=True, nogil=True)
def scan_top(values: np.ndarray, ids: np.ndarray, scores: np.ndarray, floor: float) -> None:
    """Fill ``ids``/``scores`` (descending, -1/-inf past the last, the lower index first on
    a tie) with the indices of the highest ``values`` above ``floor``. The top ``k`` of a
    long row lie in the ``k`` blocks of highest maximum, so the values are read once for
    each block's maximum (a loop the compiler vectorises), and only the blocks whose
    maximum reaches the ``k``-th best block's are walked: 64 blocks of the 1,563 in the
    neighbours' scan of 50K points, which a walk in order of index reaches one by one as
    its bar rises (there, 2x faster). A NaN never enters."""
    k = ids.shape[0]
    n = values.shape[0]
    ids[:] = -1
    scores[:] = -np.inf
    n_blocks = (n + SCAN_BLOCK - 1) // SCAN_BLOCK
    maxima = np.empty(n_blocks, np.float32)
    _block_maxima(values, maxima)
    bar = np.float32(floor)
    if n_blocks > k:  # the k-th best maximum, found by selection, not k pushes in order
        bar = max(bar, np.partition(maxima, n_blocks - k)[n_blocks - k])
    for b in range(n_blocks):
        if maxima[b] >= bar and maxima[b] > floor:
            for j in range(b * SCAN_BLOCK, min(n, (b + 1) * SCAN_BLOCK)):
                if values[j] >= bar and values[j] > floor:  # the k-th best is >= bar
                    _push(ids, scores, j, values[j])


@numba.njit(cache=True, nogil=True, fastmath={"nnan", "nsz", "reassoc"})
def _block_maxima(values: np.ndarray, maxima: np.ndarray) -> None:
    """``maxima[b]``: the maximum of block ``b`` of ``values``, undefined where one is
    NaN (which the scores here, sums of finite inputs, never are). A whole block's loop
    has a fixed count, which the compiler unrolls (2x a loop to a variable bound)."""
    n = values.shape[0]
    for b in range(n // SCAN_BLOCK):
        best = np.float32(-np.inf)
        for j in range(SCAN_BLOCK):
            best = max(best, values[b * SCAN_BLOCK + j])
        maxima[b] = best
    if n % SCAN_BLOCK:
        best = np.float32(-np.inf)
        for j in range(n - n % SCAN_BLOCK, n):
            best = max(best, values[j])
        maxima[-1] = best


@numba.njit(cache=True, nogil=True, fastmath={"nnan", "nsz", "reassoc"})
def merge_tile(
    block: np.ndarray, bias: np.ndarray, offset: int, top_ids: np.ndarray, top_scores: np.ndarray
) -> None:
    """Merge ``block[i, j] + bias[j]`` (the score of neuron ``offset + j``) into row i's
    running descending top-k ``top_ids[i]``/``top_scores[i]`` (initialise scores to -inf,
    ids to -1); one thread. The bias is added as the scores are read: one pass over a
    tile the matrix product has just left in cache. A block of scores is compared with
    the top's last through its maximum (a reduction the compiler vectorises: 2x the
    branch-free comparison once used here on exact scores of 670K labels), and
    walked only when it beats it; NaN scores never enter."""
    k = top_ids.shape[1]
    n = block.shape[1]
    for i in range(block.shape[0]):
        values, ids, scores = block[i], top_ids[i], top_scores[i]
        for start in range(0, n, SCAN_BLOCK):
            stop = min(start + SCAN_BLOCK, n)
            best = np.float32(-np.inf)
            for j in range(start, stop):
                best = max(best, values[j] + bias[j])
            if best > scores[k - 1]:
                _walk(values, bias, start, stop, offset, ids, scores)


@numba.njit(cache=True, nogil=True)
def _walk(values, bias, start, stop, offset, ids, scores) -> None:
    """:func:`merge_tile`'s pushes, without its fast-math flags: a NaN never beats."""
    for j in range(start, stop):
        score = values[j] + bias[j]
        if score > scores[-1]:
            _push(ids, scores, offset + j, score)


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
    seen: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Serving top-k: score only the neurons found in the first ``n_tables`` tables'
    buckets of each query ``h[i]`` (bucket ids ``buckets[i]``). With more than
    ``max_candidates`` (> 0) distinct neurons found, the ones found in the most tables
    are scored (ties: first found). Returns ``(local ids, scores, candidates scored)``;
    ids -1 and scores -inf where fewer than k were found.

    ``seen`` is zeroed scratch ``[slots, n_neurons]`` (left zeroed): slot s counts the
    tables that found each neuron for rows s, s + slots, ... (no sort, no per-row
    allocation of the layer's size)."""
    n = h.shape[0]
    dim = h.shape[1]
    cap = table_ids.shape[2]
    slots = seen.shape[0]
    top_ids = np.full((n, k), -1, np.int64)
    top_scores = np.full((n, k), -np.inf, np.float32)
    n_scored = np.zeros(n, np.int32)
    for s in numba.prange(slots):
        count = seen[s]
        found = np.empty(n_tables * cap, np.int32)
        chosen = np.empty(n_tables * cap, np.int32)
        hist = np.zeros(n_tables + 2, np.int64)
        for i in range(s, n, slots):
            u = 0
            for t in range(n_tables):
                b = buckets[i, t]
                for j in range(min(table_counts[t, b], cap)):
                    c = table_ids[t, b, j]
                    if count[c] == 0:
                        found[u] = c
                        u += 1
                    count[c] += 1
            m = u
            if 0 < max_candidates < u:
                hist[:] = 0
                for j in range(u):
                    hist[min(count[found[j]], n_tables)] += 1
                cut = n_tables + 1  # lowest count kept; those above it all fit
                above = 0
                while cut > 1 and above + hist[cut - 1] <= max_candidates:
                    cut -= 1
                    above += hist[cut]
                room = max_candidates - above  # of the neurons found cut - 1 times
                m = 0
                for j in range(u):
                    f = min(count[found[j]], n_tables)
                    if f >= cut or (f == cut - 1 and room > 0):
                        if f < cut:
                            room -= 1
                        chosen[m] = found[j]
                        m += 1
            else:
                chosen[:u] = found[:u]
            for j in range(u):
                count[found[j]] = 0
            n_scored[i] = m
            for j in range(m):
                c = chosen[j]
                score = bias[c]
                for d in range(dim):
                    score += h[i, d] * W[c, d]
                _push(top_ids[i], top_scores[i], c, score)
    return top_ids, top_scores, n_scored

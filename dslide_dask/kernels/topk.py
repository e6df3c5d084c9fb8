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

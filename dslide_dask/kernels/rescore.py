"""Exact scores of a few candidate rows of a wide layer, and their top-k.

An approximate index (:mod:`dslide_dask.model.output_index`) only says which rows to
look at; the answer's scores come from here, from the layer's own float32 rows, so a
label found has the logit the exact top-k gives it.
"""

import numba
import numpy as np

from dslide_dask.kernels.prefetch import AHEAD, prefetch_row_read
from dslide_dask.kernels.topk import _push

#: Up to this many rows are scored on the calling thread: a parallel launch costs more
#: than one row's few hundred dot products (serving answers one row at a time).
SERIAL_ROWS = 4


#: The dot products may be summed in any order (SIMD lanes, then across them): 6x faster
#: than one add after another, and as exact as the exact top-k's own BLAS products.
_FAST = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _dot(h, w) -> np.float32:
    total = np.float32(0.0)
    for d in range(h.shape[0]):
        total += h[d] * w[d]
    return total


@numba.njit(cache=True, nogil=True)
def _rescore_row(h, W, bias, candidates, ids, scores) -> None:
    """``ids``/``scores`` (descending, -1/-inf filled): the best of ``candidates``. A
    repeat is looked for only when a score would enter (a repeat that left the top has
    its own score, too low to come back); the rows are asked for ``AHEAD`` candidates
    early, as each is a cache miss in a layer far larger than the cache."""
    k = ids.shape[0]
    n = candidates.shape[0]
    for j in range(min(AHEAD, n)):
        if candidates[j] >= 0:
            prefetch_row_read(W, candidates[j])
    for j in range(n):
        if j + AHEAD < n and candidates[j + AHEAD] >= 0:
            prefetch_row_read(W, candidates[j + AHEAD])
        c = candidates[j]
        if c < 0:
            continue
        score = bias[c] + _dot(h, W[c])
        if score <= scores[k - 1]:
            continue
        seen = False
        for t in range(k):
            if ids[t] == c:
                seen = True
                break
        if not seen:
            _push(ids, scores, c, score)


@numba.njit(cache=True, nogil=True)
def _rescore_serial(h, W, bias, candidates, top_ids, top_scores) -> None:
    for i in range(h.shape[0]):
        _rescore_row(h[i], W, bias, candidates[i], top_ids[i], top_scores[i])


@numba.njit(cache=True, nogil=True, parallel=True)
def _rescore_parallel(h, W, bias, candidates, top_ids, top_scores) -> None:
    for i in numba.prange(h.shape[0]):
        _rescore_row(h[i], W, bias, candidates[i], top_ids[i], top_scores[i])


def rescore_topk(
    h: np.ndarray, W: np.ndarray, bias: np.ndarray, candidates: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of each row's ``candidates`` (local row ids, -1: none; a repeated
    id counts once) by ``W[c] @ h[i] + bias[c]`` in float32: ``(ids, scores)``,
    descending, ids -1 and scores -inf where fewer than k candidates were given."""
    n = len(h)
    top_ids = np.full((n, k), -1, np.int64)
    top_scores = np.full((n, k), -np.inf, np.float32)
    kernel = _rescore_serial if n <= SERIAL_ROWS else _rescore_parallel
    kernel(h, W, bias, np.ascontiguousarray(candidates, np.int64), top_ids, top_scores)
    return top_ids, top_scores

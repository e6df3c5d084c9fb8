"""Adam updates of weight rows from sparse per-example gradient contributions.

A row's gradient is ``sum coef * vectors[example]`` over its entries (an output neuron:
its logit gradients times the hidden vectors; an input feature: its values times the
hidden-layer gradients). Entries are grouped by row with a counting sort, then rows are
updated in parallel, each by one thread: lock-free like HOGWILD, but race-free, so no
update is lost and the result does not depend on the number of threads. Lazy (sparse)
Adam touches only rows with entries; ``dense=True`` is exact Adam over every row. With
``beta1 = 0`` (see ``SlideConfig.beta1``) the first moments are not kept, so their memory
is never touched. ``W_m``/``W_v`` may be float32 or bfloat16 bits (``uint16``, see
:mod:`.bfloat16`): arithmetic is float32 either way.

Bias correction is per row: a row counts its own updates (``W_n``) and is corrected as
Adam corrects its k-th step. Correcting by the global step instead makes a row's first
update at step t about ``sqrt(1 - beta2**t) / sqrt(1 - beta2)`` times the learning rate
(25x at t = 1,000): with millions of labels nearly every row is first updated late, and
those jumps blew up rare rows and starved the hidden layer.
"""

import numba
import numpy as np

from dslide_dask.kernels.bfloat16 import load_row, store_row
from dslide_dask.kernels.prefetch import AHEAD, prefetch_row

#: Rows are split into this many chunks whatever the thread count, so that the summation
#: order (and so every bit of the result) does not depend on the number of threads.
N_CHUNKS = 32
#: With back-propagation each chunk sums into a ``[B, H]`` buffer of its own: at most
#: this many floats in all (fewer chunks for wide layers, never fewer than MIN_CHUNKS),
#: so the buffers stay near the cache instead of streaming 32 MB a step at H = 1024.
PARTIAL_FLOATS = 1 << 21
MIN_CHUNKS = 8


@numba.njit(cache=True, nogil=True, parallel=True)
def group_rows(
    starts: np.ndarray, ends: np.ndarray, rows: np.ndarray, n_rows: int, n_bands: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Entries grouped by the row they touch (a counting sort): ``(offsets, entry_pos,
    entry_vec, touched)``. Row r's entries are ``offsets[r]:offsets[r+1]`` of
    ``entry_pos`` (their positions in the flat ``rows``) and ``entry_vec`` (their
    examples, in example order); ``touched`` lists the rows with entries, ascending.

    ``n_bands`` bands of rows are sorted side by side, each reading every entry and
    keeping its own: with a band a thread, the counters stay in the core's cache (one
    array over 670K rows is 5 MB of random increments); one thread is fastest with one
    band. The result is the same for any number of bands.
    """
    B = starts.shape[0]
    n_bands = max(1, min(n_bands, n_rows))
    band = (n_rows + n_bands - 1) // n_bands
    offsets = np.empty(n_rows + 1, np.int64)
    offsets[0] = 0
    ends_at = np.zeros(n_bands + 1, np.int64)  # entries, then touched rows, before a band
    touched_at = np.zeros(n_bands + 1, np.int64)
    for g in numba.prange(n_bands):  # count: offsets within the band
        lo, hi = g * band, min(n_rows, (g + 1) * band)
        count = np.zeros(max(0, hi - lo), np.int32)
        for b in range(B):
            for p in range(starts[b], ends[b]):
                r = rows[p] - lo
                if 0 <= r < hi - lo:
                    count[r] += 1
        total = 0
        n_touched = 0
        for r in range(hi - lo):
            total += count[r]
            n_touched += count[r] > 0
            offsets[lo + r + 1] = total
        ends_at[g + 1] = total
        touched_at[g + 1] = n_touched
    for g in range(n_bands):
        ends_at[g + 1] += ends_at[g]
        touched_at[g + 1] += touched_at[g]
    entry_pos = np.empty(ends_at[n_bands], np.int64)
    entry_vec = np.empty(ends_at[n_bands], np.int32)
    touched = np.empty(touched_at[n_bands], np.int64)
    for g in numba.prange(n_bands):  # place: offsets made global, entries in example order
        lo, hi = g * band, min(n_rows, (g + 1) * band)
        base = ends_at[g]
        cursor = np.empty(max(0, hi - lo), np.int32)  # within the band: stays in cache
        i = touched_at[g]
        start = 0
        for r in range(hi - lo):
            end = offsets[lo + r + 1]
            cursor[r] = start
            if end > start:
                touched[i] = lo + r
                i += 1
            offsets[lo + r + 1] = base + end
            start = end
        for b in range(B):
            for p in range(starts[b], ends[b]):
                r = rows[p] - lo
                if 0 <= r < hi - lo:
                    q = cursor[r]
                    entry_pos[base + q] = p
                    entry_vec[base + q] = b
                    cursor[r] = q + 1
    return offsets, entry_pos, entry_vec, touched


@numba.njit(cache=True, nogil=True)
def chunk_bounds(offsets: np.ndarray, rows: np.ndarray, n_chunks: int) -> np.ndarray:
    """Split ``rows`` into ``n_chunks`` runs of about equal entries (plus one per row):
    ``bounds[c]:bounds[c+1]`` is chunk c. Frequent labels have many entries; splitting
    by row count alone would leave one thread with most of the work."""
    n = rows.shape[0]
    work = np.empty(n + 1, np.int64)
    work[0] = 0
    for i in range(n):
        work[i + 1] = work[i] + offsets[rows[i] + 1] - offsets[rows[i]] + 1
    bounds = np.empty(n_chunks + 1, np.int64)
    i = 0
    for c in range(n_chunks + 1):
        target = work[n] * c // n_chunks
        while i < n and work[i] < target:
            i += 1
        bounds[c] = i
    bounds[n_chunks] = n
    return bounds


@numba.njit(cache=True, nogil=True)
def adam_rows(
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    coefs: np.ndarray,
    vectors: np.ndarray,
    W: np.ndarray,
    W_m: np.ndarray,
    W_v: np.ndarray,
    bias: np.ndarray,
    bias_m: np.ndarray,
    bias_v: np.ndarray,
    W_n: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    dense: bool,
    grad_vectors: np.ndarray,
    salt: int = 0,
    n_bands: int = 1,
) -> int:
    """Apply one Adam step; entries of example b are ``starts[b]:ends[b]`` in the flat
    ``rows``/``coefs``. ``bias`` may be empty (no per-row bias). ``dense``: every row
    takes a step, with or without entries (exact Adam); else only rows with entries.

    If ``grad_vectors`` is ``[B, H]`` (not empty) it receives ``sum coef * W_old[row]``
    per example: the back-propagated gradient, computed from each row just before it
    is updated, so the rows are read from memory once. ``salt`` seeds bfloat16 moments'
    stochastic rounding (vary it by step). ``n_bands``: :func:`group_rows`'s bands (the
    threads, which then share its passes over every row's counter: 291K rows in
    Debian-26K's input layer, for 14K entries a batch). Returns the rows touched.
    """
    offsets, entry_pos, entry_vec, touched = group_rows(starts, ends, rows, W.shape[0], n_bands)
    todo = np.arange(W.shape[0]) if dense else touched
    adam_grouped(
        offsets,
        entry_pos,
        entry_vec,
        todo,
        coefs,
        vectors,
        W,
        W_m,
        W_v,
        bias,
        bias_m,
        bias_v,
        W_n,
        lr,
        beta1,
        beta2,
        eps,
        grad_vectors,
        salt,
    )
    return touched.shape[0]


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def adam_grouped(
    offsets: np.ndarray,
    entry_pos: np.ndarray,
    entry_vec: np.ndarray,
    todo: np.ndarray,
    coefs: np.ndarray,
    vectors: np.ndarray,
    W: np.ndarray,
    W_m: np.ndarray,
    W_v: np.ndarray,
    bias: np.ndarray,
    bias_m: np.ndarray,
    bias_v: np.ndarray,
    W_n: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    grad_vectors: np.ndarray,
    salt: int = 0,
) -> None:
    """:func:`adam_rows` on entries already grouped by :func:`group_rows`, for the rows
    ``todo``: row r's gradient is ``sum coefs[entry_pos[q]] * vectors[entry_vec[q]]``."""
    H = W.shape[1]
    B = vectors.shape[0]
    backprop = grad_vectors.shape[0] > 0
    n_chunks = min(todo.shape[0], N_CHUNKS)
    if backprop:  # each chunk sums into its own [B, H] buffer: bound their total size
        n_chunks = min(n_chunks, max(MIN_CHUNKS, PARTIAL_FLOATS // max(1, B * H)))
    bounds = chunk_bounds(offsets, todo, max(1, n_chunks))
    partial = np.zeros((n_chunks if backprop else 0, B, H), np.float32)
    for c in numba.prange(n_chunks):
        grad = np.empty(H, np.float32)
        bits = np.empty((2, H), np.uint32)  # bfloat16 moments widened (unused for float32)
        for i in range(bounds[c], bounds[c + 1]):
            r = todo[i]
            if i + AHEAD < bounds[c + 1]:
                ahead = todo[i + AHEAD]
                prefetch_row(W, ahead)
                prefetch_row(W_v, ahead)
                if beta1 != 0.0:
                    prefetch_row(W_m, ahead)
            w = W[r]
            grad[:] = 0
            gb = np.float32(0.0)
            for q in range(offsets[r], offsets[r + 1]):
                coef = coefs[entry_pos[q]]
                vec = vectors[entry_vec[q]]
                gb += coef
                if backprop:
                    out = partial[c, entry_vec[q]]
                    for k in range(H):
                        grad[k] += coef * vec[k]
                        out[k] += coef * w[k]
                else:
                    for k in range(H):
                        grad[k] += coef * vec[k]
            step_row(
                r,
                grad,
                gb,
                W,
                W_m,
                W_v,
                bias,
                bias_m,
                bias_v,
                W_n,
                lr,
                beta1,
                beta2,
                eps,
                salt,
                bits,
            )
    if backprop:
        for b in numba.prange(B):
            for c in range(n_chunks):
                for k in range(H):
                    grad_vectors[b, k] += partial[c, b, k]


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def adam_given_rows(
    rows: np.ndarray,
    grads: np.ndarray,
    grad_bias: np.ndarray,
    W: np.ndarray,
    W_m: np.ndarray,
    W_v: np.ndarray,
    bias: np.ndarray,
    bias_m: np.ndarray,
    bias_v: np.ndarray,
    W_n: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    salt: int = 0,
) -> None:
    """One Adam step on the distinct ``rows``, row ``rows[i]``'s gradient being
    ``grads[i]`` (and ``grad_bias[i]``): for gradients computed as a matrix product
    (a batch's shared neurons), with the same per-row arithmetic as :func:`adam_grouped`."""
    H = W.shape[1]
    n = rows.shape[0]
    n_chunks = min(n, N_CHUNKS)
    for c in numba.prange(n_chunks):
        bits = np.empty((2, H), np.uint32)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            step_row(
                rows[i],
                grads[i],
                grad_bias[i],
                W,
                W_m,
                W_v,
                bias,
                bias_m,
                bias_v,
                W_n,
                lr,
                beta1,
                beta2,
                eps,
                salt,
                bits,
            )


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def step_row(
    r, grad, gb, W, W_m, W_v, bias, bias_m, bias_v, W_n, lr, beta1, beta2, eps, salt, bits
):
    """Adam's step of row ``r`` (and its bias, if the layer has one) given its gradient;
    ``bits`` is ``[2, H]`` uint32 scratch to widen bfloat16 moments in. (The arrays are
    passed one by one: packed in a tuple, numba 0.68 dropped the write to ``bias``.)"""
    m_bits, v_bits = bits[0], bits[1]
    H = W.shape[1]
    w = W[r]
    n = W_n[r] + 1
    W_n[r] = n
    lr_t = np.float32(lr * row_correction(beta1, beta2, n))
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    one = np.float32(1.0)
    eps = np.float32(eps)  # a float64 eps would widen every element's division
    v = load_row(W_v, r, v_bits)
    if beta1 != 0.0:
        m = load_row(W_m, r, m_bits)
        for k in range(H):
            m[k] = b1 * m[k] + (one - b1) * grad[k]
            v[k] = b2 * v[k] + (one - b2) * grad[k] * grad[k]
            w[k] -= lr_t * m[k] / (np.sqrt(v[k]) + eps)
        store_row(W_m, r, m, salt + 1)
    else:  # beta1 = 0: m would be the gradient itself; it is not kept
        for k in range(H):
            v[k] = b2 * v[k] + (one - b2) * grad[k] * grad[k]
            w[k] -= lr_t * grad[k] / (np.sqrt(v[k]) + eps)
    store_row(W_v, r, v, salt)
    if bias.shape[0] > 0:
        gm = gb
        if beta1 != 0.0:
            bias_m[r] = b1 * bias_m[r] + (one - b1) * gb
            gm = bias_m[r]
        bias_v[r] = b2 * bias_v[r] + (one - b2) * gb * gb
        bias[r] -= lr_t * gm / (np.sqrt(bias_v[r]) + eps)


@numba.njit(cache=True, nogil=True, inline="always")
def row_correction(beta1: float, beta2: float, n: int) -> float:
    """Adam's bias correction of a row's ``n``-th update."""
    return np.sqrt(1.0 - beta2**n) / (1.0 - beta1**n)


@numba.njit(cache=True, nogil=True)
def adam_dense(
    param: np.ndarray,
    grad: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    lr_t: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """One Adam step on a small dense parameter (any shape, updated in place)."""
    p, g, mm, vv = param.ravel(), grad.ravel(), m.ravel(), v.ravel()
    for i in range(p.shape[0]):
        gm = g[i]
        if beta1 != 0.0:  # else m would be the gradient itself; it is not kept
            mm[i] = beta1 * mm[i] + (1 - beta1) * g[i]
            gm = mm[i]
        vv[i] = beta2 * vv[i] + (1 - beta2) * g[i] * g[i]
        p[i] -= lr_t * gm / (np.sqrt(vv[i]) + eps)

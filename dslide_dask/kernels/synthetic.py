"""Kernels of the synthetic extreme-classification generator.

All randomness comes from a splitmix64 stream held in a ``uint64[1]`` state array and
seeded explicitly (per label, per chunk of points), so results depend only on the
seeds, not on numpy/numba random internals or on how many threads run the chunks.
"""

import numba
import numpy as np

from dslide_dask.kernels.tables import mix64
from dslide_dask.kernels.xc_text import quantize6, shell_sort

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0
_HASH = 0x9E3779B1


@numba.njit(cache=True, nogil=True)
def _next(state: np.ndarray) -> np.uint64:
    state[0] += _GOLDEN
    return mix64(state[0])


@numba.njit(cache=True, nogil=True)
def _uniform(state: np.ndarray) -> float:
    """Uniform in [0, 1)."""
    return float(_next(state) >> _S11) * _INV53


@numba.njit(cache=True, nogil=True)
def _randint(state: np.ndarray, n: int) -> int:
    """Uniform in [0, n)."""
    return min(int(_uniform(state) * n), n - 1)


@numba.njit(cache=True, nogil=True)
def _normal(state: np.ndarray) -> float:
    u1 = 1.0 - _uniform(state)
    u2 = _uniform(state)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@numba.njit(cache=True, nogil=True)
def new_state(seed: np.uint64) -> np.ndarray:
    """A fresh stream state for ``seed``."""
    s = np.empty(1, np.uint64)
    s[0] = mix64(np.uint64(seed) + _GOLDEN)
    return s


@numba.njit(cache=True, nogil=True)
def permutation(n: int, seed: np.uint64) -> np.ndarray:
    """A random permutation of ``0..n-1`` (int64), Fisher-Yates."""
    s = new_state(seed)
    p = np.arange(n)
    for i in range(n - 1, 0, -1):
        j = _randint(s, i + 1)
        p[i], p[j] = p[j], p[i]
    return p


@numba.njit(cache=True, nogil=True)
def build_alias(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table ``(prob, alias)`` for sampling ids ∝ ``weights``."""
    n = len(weights)
    total = weights.sum()
    scaled = weights * (n / total)
    prob = np.ones(n, np.float64)
    alias = np.arange(n).astype(np.int32)
    small = np.empty(n, np.int64)
    large = np.empty(n, np.int64)
    ns = 0
    nl = 0
    for i in range(n):
        if scaled[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        g = large[nl - 1]
        prob[s] = scaled[s]
        alias[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        if scaled[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    return prob, alias


@numba.njit(cache=True, nogil=True)
def _alias_draw(state: np.ndarray, prob: np.ndarray, alias: np.ndarray) -> int:
    i = _randint(state, len(prob))
    return i if _uniform(state) < prob[i] else alias[i]


@numba.njit(cache=True, nogil=True)
def make_signatures(
    n_labels: int,
    seed: np.uint64,
    sig_min: int,
    sig_max: int,
    sig_prob: np.ndarray,
    sig_alias: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each label's signature features as CSR ``(indptr, indices)``.

    Label l's signature depends only on ``(seed, l)``: ``sig_min..sig_max`` distinct
    features drawn from the alias table ``(sig_prob, sig_alias)``.
    """
    indptr = np.zeros(n_labels + 1, np.int64)
    idx = np.empty(n_labels * sig_max, np.int32)
    s = np.empty(1, np.uint64)
    nf = len(sig_prob)
    p = 0
    for lab in range(n_labels):
        s[0] = mix64(seed ^ mix64(np.uint64(lab) + _GOLDEN))
        size = min(sig_min + _randint(s, sig_max - sig_min + 1), nf)
        start = p
        attempts = 0
        while p - start < size and attempts < 50 * size:
            attempts += 1
            f = _alias_draw(s, sig_prob, sig_alias)
            seen = False
            for q in range(start, p):
                if idx[q] == f:
                    seen = True
                    break
            if not seen:
                idx[p] = f
                p += 1
        indptr[lab + 1] = p
    return indptr, idx[:p].copy()


@numba.njit(cache=True, nogil=True)
def _probe(keys: np.ndarray, mask: int, key: int) -> int:
    """Slot of ``key`` in the open-addressing table, or of the empty slot for it."""
    h = (key * _HASH) & mask
    while keys[h] != -1 and keys[h] != key:
        h = (h + 1) & mask
    return h


@numba.njit(cache=True, nogil=True)
def _table_mask(n: int) -> int:
    size = 16
    while size < 2 * n:
        size *= 2
    return size - 1


@numba.njit(cache=True, nogil=True)
def generate_chunk(
    seed: np.uint64,
    n_points: int,
    empty_frac: float,
    extra_labels_mean: float,
    max_labels: int,
    nnz_mu: float,
    nnz_sigma: float,
    max_nnz: int,
    signal_frac: float,
    topic_mix: float,
    lab_prob: np.ndarray,
    lab_alias: np.ndarray,
    topic_prob: np.ndarray,
    topic_alias: np.ndarray,
    topic_ptr: np.ndarray,
    topic_labels: np.ndarray,
    topic_cum: np.ndarray,
    sig_indptr: np.ndarray,
    sig_idx: np.ndarray,
    bg_prob: np.ndarray,
    bg_alias: np.ndarray,
    idf: np.ndarray,
):
    """Points of one chunk: ``(y_indptr, y_indices, x_indptr, x_indices, x_data)``.

    Per point: k labels (0 with prob ``empty_frac``, else 1 + geometric with mean
    ``extra_labels_mean``) drawn from one topic (prob ``topic_mix`` a draw) or globally,
    ∝ label popularity, distinct; a log-normal number of distinct features of which
    ``signal_frac`` of the draws come from the labels' signatures and the rest from the
    background distribution; values tf * idf * jitter, L2-normalized, 6 digits; labels
    and features sorted ascending.
    """
    s = new_state(seed)
    # sizes first: they fix the output layout
    ks = np.empty(n_points, np.int64)
    nnzs = np.empty(n_points, np.int64)
    q = extra_labels_mean / (1.0 + extra_labels_mean)
    log_q = np.log(q) if q > 0 else -1.0
    for i in range(n_points):
        if _uniform(s) < empty_frac:
            k = 0
        elif q > 0:
            k = 1 + int(np.floor(np.log(1.0 - _uniform(s)) / log_q))
        else:
            k = 1
        ks[i] = min(k, max_labels)
        nz = int(np.exp(nnz_mu + nnz_sigma * _normal(s)) + 0.5)
        nnzs[i] = max(1, min(nz, max_nnz))
    y_indptr = np.zeros(n_points + 1, np.int64)
    x_indptr = np.zeros(n_points + 1, np.int64)
    for i in range(n_points):
        y_indptr[i + 1] = y_indptr[i] + ks[i]
        x_indptr[i + 1] = x_indptr[i] + nnzs[i]
    y_idx = np.empty(y_indptr[-1], np.int32)
    x_idx = np.empty(x_indptr[-1], np.int32)
    x_val = np.empty(x_indptr[-1], np.float32)
    y_len = np.zeros(n_points, np.int64)
    x_len = np.zeros(n_points, np.int64)
    lab_keys = np.full(_table_mask(max(1, ks.max())) + 1, -1, np.int32)
    feat_keys = np.full(_table_mask(max(1, nnzs.max())) + 1, -1, np.int32)
    feat_slot = np.zeros(len(feat_keys), np.int64)
    tf = np.zeros(max(1, nnzs.max()), np.float64)
    for i in range(n_points):
        # ---- labels
        k = ks[i]
        y0 = y_indptr[i]
        ny = 0
        t = _alias_draw(s, topic_prob, topic_alias)
        t_lo = topic_ptr[t]
        t_hi = topic_ptr[t + 1]
        t_base = topic_cum[t_lo - 1] if t_lo > 0 else 0.0
        t_mass = topic_cum[t_hi - 1] - t_base if t_hi > t_lo else 0.0
        lmask = _table_mask(max(1, k))
        attempts = 0
        while ny < k and attempts < 50 * k + 100:
            attempts += 1
            if t_mass > 0 and attempts <= 20 * k + 20 and _uniform(s) < topic_mix:
                r = t_base + _uniform(s) * t_mass
                a, b = t_lo, t_hi - 1  # first label whose cumulative weight exceeds r
                while a < b:
                    mid = (a + b) >> 1
                    if topic_cum[mid] <= r:
                        a = mid + 1
                    else:
                        b = mid
                lab = topic_labels[a]
            else:
                lab = _alias_draw(s, lab_prob, lab_alias)
            h = _probe(lab_keys, lmask, lab)
            if lab_keys[h] == -1:
                lab_keys[h] = lab
                y_idx[y0 + ny] = lab
                ny += 1
        lab_keys[: lmask + 1] = -1
        labs = y_idx[y0 : y0 + ny]
        shell_sort(labs, labs)
        y_len[i] = ny
        # ---- features: signature draws (signal) then background draws (noise)
        target = nnzs[i]
        x0 = x_indptr[i]
        nx = 0
        fmask = _table_mask(target)
        n_sig = int(signal_frac * target + 0.5) if ny > 0 else 0
        for _ in range(n_sig):
            lab = y_idx[y0 + _randint(s, ny)]
            lo = sig_indptr[lab]
            hi = sig_indptr[lab + 1]
            if hi == lo:
                continue
            f = sig_idx[lo + _randint(s, hi - lo)]
            h = _probe(feat_keys, fmask, f)
            if feat_keys[h] == -1:
                feat_keys[h] = f
                feat_slot[h] = nx
                x_idx[x0 + nx] = f
                tf[nx] = 1.0
                nx += 1
            else:
                tf[feat_slot[h]] += 1.0
        attempts = 0
        while nx < target and attempts < 4 * target + 50:
            attempts += 1
            f = _alias_draw(s, bg_prob, bg_alias)
            h = _probe(feat_keys, fmask, f)
            if feat_keys[h] == -1:
                feat_keys[h] = f
                feat_slot[h] = nx
                x_idx[x0 + nx] = f
                tf[nx] = 1.0
                nx += 1
            else:
                tf[feat_slot[h]] += 1.0
        feat_keys[: fmask + 1] = -1
        norm = 0.0
        for j in range(nx):
            v = tf[j] * idf[x_idx[x0 + j]] * (0.6 + 0.8 * _uniform(s))
            tf[j] = v
            norm += v * v
        norm = 1.0 / np.sqrt(norm) if norm > 0 else 0.0
        for j in range(nx):
            x_val[x0 + j] = quantize6(tf[j] * norm)
        shell_sort(x_idx[x0 : x0 + nx], x_val[x0 : x0 + nx])
        x_len[i] = nx
    # compact rows that came out shorter than planned (rare)
    if (y_len != ks).any():
        y_indptr, y_idx = _compact(y_indptr, y_idx, y_len)
    if (x_len != nnzs).any():
        x_indptr2, x_idx = _compact(x_indptr, x_idx, x_len)
        _, x_val = _compact(x_indptr, x_val, x_len)
        x_indptr = x_indptr2
    return y_indptr, y_idx, x_indptr, x_idx, x_val


@numba.njit(cache=True, nogil=True)
def _compact(indptr: np.ndarray, values: np.ndarray, lengths: np.ndarray):
    n = len(lengths)
    out_ptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        out_ptr[i + 1] = out_ptr[i] + lengths[i]
    out = np.empty(out_ptr[-1], values.dtype)
    for i in range(n):
        out[out_ptr[i] : out_ptr[i + 1]] = values[indptr[i] : indptr[i] + lengths[i]]
    return out_ptr, out

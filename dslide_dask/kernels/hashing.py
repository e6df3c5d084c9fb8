"""LSH hash families: bucket ids of vectors for L tables of K concatenated codes.

Each family yields ``K * L`` small codes per vector (SimHash: 1 bit; DWTA: the argmax
position inside a bin, ``log2(bin_size)`` bits). The K codes of a table are packed into
one integer and, when wider than ``range_pow`` bits, folded by a multiplicative hash.
"""

import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True, inline="always")
def _bucket(packed: np.uint64, packed_bits: int, range_pow: int) -> np.int32:
    if packed_bits <= range_pow:
        return np.int32(packed)
    return np.int32((packed * _GOLDEN) >> np.uint64(64 - range_pow))


@numba.njit(cache=True, nogil=True, parallel=True)
def simhash_buckets(projected: np.ndarray, K: int, L: int, range_pow: int) -> np.ndarray:
    """Bucket ids ``[n, L]`` from signed random projections ``projected[n, K*L]``."""
    n = projected.shape[0]
    out = np.empty((n, L), np.int32)
    for i in numba.prange(n):
        for t in range(L):
            packed = np.uint64(0)
            for k in range(K):
                if projected[i, t * K + k] > 0:
                    packed |= np.uint64(1) << np.uint64(k)
            out[i, t] = _bucket(packed, K, range_pow)
    return out


_LANES = 16  # rows hashed together, so the argmax over a bin runs as SIMD selects


@numba.njit(cache=True, nogil=True, parallel=True)
def dwta_buckets(
    vectors: np.ndarray, bins: np.ndarray, K: int, L: int, range_pow: int, code_bits: int
) -> np.ndarray:
    """Densified winner-take-all bucket ids ``[n, L]``.

    ``bins[h]`` lists the ``bin_size`` dimensions of hash h (``K*L`` hashes). A code is
    the position of the largest value in the bin; a bin whose values are all zero (common
    after ReLU) borrows the code of the next non-empty bin along a fixed probe sequence
    (densification), so every vector gets a full set of codes.
    """
    n, dim = vectors.shape
    n_hashes, bin_size = bins.shape
    out = np.empty((n, L), np.int32)
    for blk in numba.prange((n + _LANES - 1) // _LANES):
        lo = blk * _LANES
        rows = min(_LANES, n - lo)
        tv = np.zeros((dim, _LANES), np.float32)  # the block, transposed
        for r in range(rows):
            for d in range(dim):
                tv[d, r] = vectors[lo + r, d]
        codes = np.empty((n_hashes, _LANES), np.int32)
        best = np.empty(_LANES, np.float32)
        arg = np.empty(_LANES, np.int32)
        magnitude = np.empty(_LANES, np.float32)  # max |value|: 0 for an all-zero bin
        for h in range(n_hashes):
            d0 = bins[h, 0]
            for r in range(_LANES):
                best[r] = tv[d0, r]
                arg[r] = 0
                magnitude[r] = abs(tv[d0, r])
            for j in range(1, bin_size):
                d = bins[h, j]
                for r in range(_LANES):
                    v = tv[d, r]
                    better = v > best[r]
                    best[r] = v if better else best[r]
                    arg[r] = j if better else arg[r]
                    magnitude[r] = max(magnitude[r], abs(v))
            for r in range(_LANES):
                codes[h, r] = arg[r] if magnitude[r] > 0 else -1
        for r in range(rows):
            for t in range(L):
                packed = np.uint64(0)
                for k in range(K):
                    h = t * K + k
                    code = codes[h, r]
                    attempt = 1
                    while code < 0 and attempt <= n_hashes:
                        code = codes[(h + attempt * 97) % n_hashes, r]
                        attempt += 1
                    if code < 0:  # the whole vector is zero
                        code = 0
                    packed |= np.uint64(code) << np.uint64(k * code_bits)
                out[lo + r, t] = _bucket(packed, K * code_bits, range_pow)
    return out

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
    n = vectors.shape[0]
    n_hashes, bin_size = bins.shape
    out = np.empty((n, L), np.int32)
    for i in numba.prange(n):
        codes = np.full(n_hashes, -1, np.int32)
        for h in range(n_hashes):
            best = np.float32(0.0)
            arg = -1
            for j in range(bin_size):
                v = vectors[i, bins[h, j]]
                if v != 0 and (arg < 0 or v > best):
                    best = v
                    arg = j
            codes[h] = arg
        for t in range(L):
            packed = np.uint64(0)
            for k in range(K):
                h = t * K + k
                code = codes[h]
                attempt = 1
                while code < 0 and attempt <= n_hashes:
                    code = codes[(h + attempt * 97) % n_hashes]
                    attempt += 1
                if code < 0:  # the whole vector is zero
                    code = 0
                packed |= np.uint64(code) << np.uint64(k * code_bits)
            out[i, t] = _bucket(packed, K * code_bits, range_pow)
    return out

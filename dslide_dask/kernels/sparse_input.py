"""The first layer: a sparse input row times a feature-major weight matrix ``W[D, H]``."""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, parallel=True)
def forward(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, W: np.ndarray, bias: np.ndarray
) -> np.ndarray:
    """Pre-activations ``z[b] = bias + sum_p values[p] * W[indices[p]]`` for each row b."""
    B = indptr.shape[0] - 1
    H = W.shape[1]
    z = np.empty((B, H), np.float32)
    for b in numba.prange(B):
        zb = z[b]
        zb[:] = bias
        for p in range(indptr[b], indptr[b + 1]):
            x = values[p]
            w = W[indices[p]]
            for k in range(H):
                zb[k] += x * w[k]
    return z

"""bfloat16 storage for float32 arithmetic: Adam's moments at 2 bytes a parameter.

A bfloat16 is the top 16 bits of a float32 (same exponent range, 8 bits of mantissa),
kept here as ``uint16``. Kernels widen a row into float32, compute, and narrow it back
with *stochastic* rounding: Adam's second moment moves by ``1 - beta2 = 0.1%`` a step,
less than bfloat16's resolution (0.4%), so round-to-nearest would freeze it, while
rounding up with probability equal to the remainder keeps every update right on average.
The random bits come from a hash of (salt, row, column): reproducible, and independent
of the thread count.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import overload

#: Storage dtypes of Adam moments, by the name ``SlideConfig.moment_dtype`` uses.
STORAGE = {"float32": np.float32, "bfloat16": np.uint16}


def to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (for conversions, not updates)."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.minimum(rounded, 0xFFFF).astype(np.uint16)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def convert(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` (float32 or bfloat16 bits) in the storage dtype of ``like``."""
    if value.dtype == like.dtype:
        return value
    if like.dtype == np.uint16:
        return to_bfloat16(value)
    return from_bfloat16(value)


def load_row(state, r, bits):  # pragma: no cover (replaced by the overload in kernels)
    """Row ``r`` of ``state`` as float32: the row itself, or widened into ``bits``."""
    raise NotImplementedError


def store_row(state, r, row, salt):  # pragma: no cover
    """Write back a row :func:`load_row` gave (a no-op for float32 storage)."""
    raise NotImplementedError


@overload(load_row, inline="always")
def _load_row(state, r, bits):
    if state.dtype == types.uint16:

        def widen(state, r, bits):
            src = state[r]
            for k in range(src.shape[0]):
                bits[k] = np.uint32(src[k]) << np.uint32(16)
            return bits.view(np.float32)

        return widen
    return lambda state, r, bits: state[r]


@overload(store_row, inline="always")
def _store_row(state, r, row, salt):
    if state.dtype == types.uint16:

        def narrow(state, r, row, salt):
            dst = state[r]
            bits = row.view(np.uint32)
            base = np.uint32(salt) ^ (np.uint32(r) * np.uint32(0x9E3779B1))
            for k in range(dst.shape[0]):
                noise = _mix32(base + np.uint32(k) * np.uint32(0x85EBCA77)) & np.uint32(0xFFFF)
                dst[k] = np.uint16(min((np.uint64(bits[k]) + noise) >> 16, np.uint64(0xFFFF)))

        return narrow
    return lambda state, r, row, salt: None


@numba.njit(inline="always")
def _mix32(x):
    """A 32-bit integer hash (murmur3's finaliser)."""
    x = np.uint32(x)
    x ^= x >> np.uint32(16)
    x = np.uint32(x * np.uint32(0x85EBCA6B))
    x ^= x >> np.uint32(13)
    x = np.uint32(x * np.uint32(0xC2B2AE35))
    x ^= x >> np.uint32(16)
    return x

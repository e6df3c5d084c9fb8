"""Lossless compact codes for the arrays of the converted layout (see ``data.binary``).

- **ids** (feature or label ids, row by row): each id as its difference from the previous
  id of its row (the first from 0) in a ``uint16``; an id whose difference is negative or
  does not fit is written as :data:`ID_ESCAPE` and stored whole, in order, in an ``int32``
  escape array. Rows with sorted ids far apart by less than 65,535 need no escape: 2
  bytes an id instead of 4.
- **values** (float32 feature values): XC text carries a few significant digits, so a
  value is usually ``m / 10**k`` exactly (as float32) with ``m < 2**20`` and ``k < 15``:
  ``digits`` (``uint16``) keeps the low 16 bits of ``m``, ``scale`` (``uint8``) the high 4
  bits of ``m`` and ``k``; any other value (negative, -0.0, more digits) has ``k ==``
  :data:`VALUE_ESCAPE` and is stored as raw float32 in order. 3 bytes a value instead
  of 4. Encoding checks every value against the decoder's own arithmetic, so decoding
  gives back the very same bits.

Decoders never trust their input: they return ``(code, position, value)`` with
``code == OK`` or the first problem found, for the caller to put into words.
"""

import math

import numba
import numpy as np

ID_ESCAPE = 0xFFFF
VALUE_ESCAPE = 15
_MAX_DIGITS = 1 << 20
# value = m * 10**-k: a product (not a quotient) so decoding vectorises; 10**-k is not
# exact, but encoding accepts a code only when this very product gives the value back
_P10 = np.array([10.0**k for k in range(VALUE_ESCAPE)], np.float64)
# (index VALUE_ESCAPE gives 0.0: escaped entries decode to 0, then get their raw value)
_INV_P10 = np.array([10.0**-k for k in range(VALUE_ESCAPE)] + [0.0], np.float64)

# codes returned by the decoders
OK = 0
ERR_ESCAPES_SHORT = 1  # an escape code but the escape array is used up (position)
ERR_ESCAPES_LEFT = 2  # escapes left over when every code was read (value = how many)
ERR_ID_RANGE = 3  # a decoded id outside [0, n_cols) (position, value)
ERR_SHAPE = 4  # the arrays given do not fit together (a caller's bug, not bad data)


@numba.njit(cache=True, nogil=True)
def encode_ids(indptr: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(deltas, escapes)`` of the CSR ids ``ids`` with rows ``indptr``."""
    deltas = np.empty(len(ids), np.uint16)
    escapes = np.empty(len(ids), np.int32)
    n_escapes = 0
    for r in range(len(indptr) - 1):
        prev = np.int64(0)
        for j in range(indptr[r], indptr[r + 1]):
            v = np.int64(ids[j])
            d = v - prev
            if 0 <= d < ID_ESCAPE:
                deltas[j] = d
            else:
                deltas[j] = ID_ESCAPE
                escapes[n_escapes] = v
                n_escapes += 1
            prev = v
    return deltas, escapes[:n_escapes].copy()


@numba.njit(cache=True, nogil=True)
def decode_ids(
    indptr: np.ndarray, deltas: np.ndarray, escapes: np.ndarray, n_cols: int, out: np.ndarray
) -> tuple[int, int, int]:
    """Write the ids coded by :func:`encode_ids` into ``out`` (``len(deltas)`` entries;
    ``indptr[-1] == len(deltas)``)."""
    if len(out) != len(deltas) or len(indptr) == 0 or indptr[-1] != len(deltas):
        return ERR_SHAPE, 0, 0
    e = 0
    for r in range(len(indptr) - 1):
        prev = np.int64(0)
        for j in range(indptr[r], indptr[r + 1]):
            d = deltas[j]
            if d == ID_ESCAPE:
                if e == len(escapes):
                    return ERR_ESCAPES_SHORT, j, 0
                v = np.int64(escapes[e])
                e += 1
            else:
                v = prev + d
            if v < 0 or v >= n_cols:
                return ERR_ID_RANGE, j, v  # type: ignore[return-value]  # numba returns an int
            out[j] = v
            prev = v
    if e != len(escapes):
        return ERR_ESCAPES_LEFT, len(deltas), len(escapes) - e
    return OK, 0, 0


@numba.njit(cache=True, nogil=True)
def encode_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(digits, scale, raw)`` of the float32 ``values``."""
    n = len(values)
    digits = np.zeros(n, np.uint16)
    scale = np.empty(n, np.uint8)
    raw = np.empty(n, np.float32)
    n_raw = 0
    for i in range(n):
        x = values[i]
        k_found = VALUE_ESCAPE
        m = np.int64(0)
        if x > 0 or (x == 0 and math.copysign(1.0, x) > 0):
            for k in range(VALUE_ESCAPE):
                m = np.int64(np.round(np.float64(x) * _P10[k]))
                if m >= _MAX_DIGITS:
                    break
                if np.float32(m * _INV_P10[k]) == x:
                    k_found = k
                    break
        if k_found == VALUE_ESCAPE:
            scale[i] = VALUE_ESCAPE
            raw[n_raw] = x
            n_raw += 1
        else:
            digits[i] = m & 0xFFFF
            scale[i] = ((m >> 16) << 4) | k_found
    return digits, scale, raw[:n_raw].copy()


@numba.njit(cache=True, nogil=True)
def decode_values(
    digits: np.ndarray, scale: np.ndarray, raw: np.ndarray, out: np.ndarray
) -> tuple[int, int, int]:
    """Write the values coded by :func:`encode_values` into ``out`` (``len(digits)``
    entries; ``len(scale) == len(digits)``)."""
    if len(scale) != len(digits) or len(out) != len(digits):
        return ERR_SHAPE, 0, 0
    n_raw = 0  # escapes are patched in afterwards, in a second pass only if there are any
    for i in range(len(digits)):  # no branch: vectorises
        s = scale[i]
        k = s & 15
        n_raw += k == VALUE_ESCAPE
        m = (np.int64(s >> 4) << 16) | np.int64(digits[i])
        out[i] = np.float32(m * _INV_P10[k])
    e = 0
    if n_raw or len(raw):
        for i in range(len(digits)):
            if scale[i] & 15 == VALUE_ESCAPE:
                if e == len(raw):
                    return ERR_ESCAPES_SHORT, i, 0
                out[i] = raw[e]
                e += 1
    if e != len(raw):
        return ERR_ESCAPES_LEFT, len(digits), len(raw) - e
    return OK, 0, 0

"""Row copies between two arrays of the same dtype, in place: no temporary array.

``dst[rows_to] = src[rows_from]`` in numpy first gathers the rows into a new array; for
hundreds of megabytes that allocation (and the first touch of its pages) costs more than
the copy itself.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, parallel=True)
def _copy_rows(dst: np.ndarray, rows_to: np.ndarray, src: np.ndarray, rows_from: np.ndarray):
    for i in numba.prange(rows_to.shape[0]):
        dst[rows_to[i], :] = src[rows_from[i], :]


def copy_rows(dst: np.ndarray, rows_to: np.ndarray, src: np.ndarray, rows_from: np.ndarray):
    """Copy row ``rows_from[i]`` of ``src`` onto row ``rows_to[i]`` of ``dst`` (C-contiguous
    arrays of one dtype, 1-D or 2-D with rows of one width)."""
    if dst.dtype != src.dtype or dst.shape[1:] != src.shape[1:] or len(rows_to) != len(rows_from):
        raise ValueError(
            f"rows of {src.dtype}{list(src.shape[1:])} onto {dst.dtype}{list(dst.shape[1:])}, "
            f"{len(rows_from)} onto {len(rows_to)}"
        )
    _copy_rows(
        dst.reshape(len(dst), -1),
        np.asarray(rows_to, np.int64),
        src.reshape(len(src), -1),
        np.asarray(rows_from, np.int64),
    )


def take_rows(src: np.ndarray, rows_from: np.ndarray) -> np.ndarray:
    """A new array of rows ``rows_from`` of ``src`` (``src[rows_from]``, one pass)."""
    out = np.empty((len(rows_from), *src.shape[1:]), src.dtype)
    copy_rows(out, np.arange(len(rows_from)), np.ascontiguousarray(src), rows_from)
    return out

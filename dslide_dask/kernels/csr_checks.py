"""One pass over a CSR matrix that says whether it needs the slower checks at all.

:func:`~dslide_dask.data.csr.as_csr` refuses ids out of range, a row holding a column
twice and values that are not finite, each with the row named; for a served row those
dozen small numpy calls cost more than its answer's fusion. :func:`well_formed` tells in
one pass that none of them can fail (the usual case); only when it says no are they run,
to name what is wrong.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def well_formed(indptr: np.ndarray, indices: np.ndarray, data, n_cols: int) -> bool:
    """Whether ``indptr`` never decreases, each row's ids increase strictly within
    ``[0, n_cols)`` and every value of ``data`` (None: a pattern) is finite."""
    for i in range(indptr.shape[0] - 1):
        if indptr[i + 1] < indptr[i]:
            return False
        last = -1
        for e in range(indptr[i], indptr[i + 1]):
            if indices[e] <= last or indices[e] >= n_cols:
                return False
            last = indices[e]
    if data is not None:
        for e in range(data.shape[0]):
            if not np.isfinite(data[e]):
                return False
    return True

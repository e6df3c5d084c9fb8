"""A step's sparse update, cut down to the rows another shard holds, for it to replay.

A shard streaming its rows to the shards of a new layout (a live re-balance) sends each
step the update of the rows it has sent so far: the logit gradients of their entries,
grouped by row as :func:`~dslide_dask.kernels.adam.group_rows` grouped them, rather than
the rows again. Replayed through :func:`~dslide_dask.kernels.adam.adam_grouped` in the
same order, they give the receiving rows the same bits.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def entries_of(
    offsets: np.ndarray,
    entry_pos: np.ndarray,
    entry_vec: np.ndarray,
    touched: np.ndarray,
    coefs: np.ndarray,
    to_new: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The entries of the ``touched`` rows that have a row elsewhere (``to_new[r] >= 0``,
    its index there; increasing in r): ``(rows there, entries per row, example of each
    entry, its coefficient)``, rows ascending and each row's entries in example order."""
    n_rows = 0
    n_entries = 0
    for i in range(touched.shape[0]):
        r = touched[i]
        if to_new[r] >= 0:
            n_rows += 1
            n_entries += offsets[r + 1] - offsets[r]
    rows = np.empty(n_rows, np.int32)
    counts = np.empty(n_rows, np.int32)
    vec = np.empty(n_entries, np.int32)
    coef = np.empty(n_entries, np.float32)
    i_row = 0
    e = 0
    for i in range(touched.shape[0]):
        r = touched[i]
        if to_new[r] < 0:
            continue
        rows[i_row] = to_new[r]
        counts[i_row] = offsets[r + 1] - offsets[r]
        i_row += 1
        for q in range(offsets[r], offsets[r + 1]):
            vec[e] = entry_vec[q]
            coef[e] = coefs[entry_pos[q]]
            e += 1
    return rows, counts, vec, coef

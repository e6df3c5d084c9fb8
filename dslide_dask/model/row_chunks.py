"""How many chunks the row kernels split a block of query rows into."""

from __future__ import annotations

import numba

#: Chunks of a block of query rows each thread takes in the kernels. Each chunk owns
#: scratch over the points, features and labels (megabytes at 670K labels, zeroed as it
#: is allocated), so few; more than one, so a thread whose rows were cheap takes another.
#: 64 chunks of 256 served rows: 0.100 ms a row on one core, 4: 0.085.
CHUNKS_PER_THREAD = 4


def row_chunks(n_rows: int | None = None) -> int:
    """:data:`CHUNKS_PER_THREAD` a thread; one for a single row (``n_rows`` 1), as the
    kernels would make it, without asking numba for its threads (a served row's
    microseconds)."""
    return 1 if n_rows == 1 else CHUNKS_PER_THREAD * numba.get_num_threads()

"""OpenMP's wait policy for numba's threads, set where training starts.

numba's OpenMP threading layer spins between parallel regions by default; on a busy
machine (other processes, Dask workers side by side) each kernel launch then waits for a
scheduler time slice. A passive wait hands the core back instead. OpenMP reads the
policy once, when numba first loads it (the first parallel kernel of a process), so
:func:`passive_wait` runs where trainers, actors and the CLI start, before any kernel,
and never on ``import dslide_dask``. A policy the user set is kept.
"""

from __future__ import annotations

import os

VARIABLE = "OMP_WAIT_POLICY"


def passive_wait() -> None:
    """Have OpenMP threads of this process (and of processes it starts) wait passively,
    unless the user chose a policy."""
    os.environ.setdefault(VARIABLE, "PASSIVE")

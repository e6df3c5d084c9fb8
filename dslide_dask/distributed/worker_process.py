"""What an actor sets up in the worker process it starts in, each part idempotent."""

from __future__ import annotations

from dslide_dask.distributed.errors import quiet_calls_of_released_actors
from dslide_dask.malloc import raise_malloc_thresholds
from dslide_dask.omp import passive_wait


def prepare_worker_process() -> None:
    """Large temporaries reuse heap pages (:mod:`dslide_dask.malloc`); OpenMP threads wait
    passively, not spinning on cores the other actors need; a call on an actor that died
    with its worker is not logged as a traceback (the trainer reports the loss)."""
    raise_malloc_thresholds()
    passive_wait()
    quiet_calls_of_released_actors()

"""What the fused model's tasks need of the workers they run on: numba's threads, and a
wait that notices a worker leaving.

A fused model's tasks are pinned to the workers that hold its parts, so a worker that
dies (its nanny restarts it under a new address) would leave them waiting forever:
:func:`watched` fails them in one line instead. While the parts are built or asked, the
model's other workers only answer the builder's calls, so the builder may take their
share of its host (:func:`idle_threads`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dslide_dask.distributed.liveness import still_listed, workers_now
from dslide_dask.errors import ShardLostError


def worker_threads(threads: int | None = None) -> int:
    """numba's threads for this task (returned): the worker's threads (its share of the
    machine), not every core (numba's default), which workers side by side would
    oversubscribe; ``threads`` where the task has more of the machine
    (:func:`idle_threads`)."""
    import numba
    from distributed import get_worker

    threads = threads or get_worker().state.nthreads
    most = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    numba.set_num_threads(max(1, min(threads, most)))
    return numba.get_num_threads()


def on_threads(task: Callable) -> Callable:
    """``task`` run on the numba and BLAS threads its ``threads`` keyword gives
    (:func:`worker_threads`). A worker's BLAS has one thread (its nanny sets
    ``OMP_NUM_THREADS=1``), so the builder's hidden-space products (a query's rows
    against every point's hidden vector) ran on one core beside idle ones: a Debian-26K
    evaluation took 9.3 s on the cluster, 4 s in one process."""

    @functools.wraps(task)
    def run(*args: Any, threads: int | None = None, **kwargs: Any) -> Any:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=worker_threads(threads), user_api="blas"):
            return task(*args, **kwargs)

    return run


def idle_threads(client: Any, workers: list[str], where: str) -> int:
    """The threads of ``workers`` on the host of ``where``: while the fused parts are
    built or asked, the model's other workers there only answer the builder's calls (it
    waits for them), so the builder may use their share of the machine too."""
    info = workers_now(client)
    host = info[where]["host"]
    return sum(int(info[w]["nthreads"]) for w in workers if w in info and info[w]["host"] == host)


#: Seconds between two looks at whether the workers a build needs are still there.
WATCH_SECONDS = 2.0


def watched(
    client: Any, future: Any, workers: tuple[str, ...], what: str, *, fetch: bool = True
) -> Any:
    """``future``'s result (``fetch=False``: None once it is done, the result left where it
    is: a fused model is gigabytes), or :class:`ShardLostError` as soon as one of
    ``workers`` (where its tasks are pinned) leaves the cluster: a task pinned to a worker
    that died (its nanny restarts it under a new address) would otherwise wait for it
    forever. What failed there is raised here."""
    from distributed import wait

    while True:
        try:
            wait([future], timeout=WATCH_SECONDS)
            break
        except TimeoutError:
            gone = set(workers) - still_listed(client, set(workers))
            if gone:
                future.cancel()
                raise ShardLostError(
                    f"{what}: worker {sorted(gone)[0]} left the cluster (out of memory? "
                    "`dslide plan` shows what each worker holds; --opt neighbours=0 trains "
                    "the network alone)"
                ) from None
    if future.status == "error":
        future.result()  # raises here what failed there
    return future.result() if fetch else None

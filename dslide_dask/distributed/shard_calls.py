"""Calls from the coordinator (:mod:`.coordinator`) to its shards and its kernel thread:
every shard at once, timed, failing fast when a shard's worker is gone; model arithmetic
on the one kernel thread of the process.

Apart from the training loop because it is the plumbing under every coordinator call
(steps, queries, mirroring, checkpoints and graph steps alike), not part of a step.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numba

from dslide_dask.distributed.errors import POLL_SECONDS
from dslide_dask.distributed.liveness import scheduler_lists
from dslide_dask.distributed.turns import TicketBook
from dslide_dask.errors import ShardLostError

#: The one thread of a worker process that runs the coordinators' and their local shards'
#: kernels, one call at a time (its thread starts with the first call).
KERNEL_THREAD = ThreadPoolExecutor(1, thread_name_prefix="dslide-kernels")


async def on_kernel_thread(fn, *args):
    """``fn(*args)`` on :data:`KERNEL_THREAD`, awaited from the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(KERNEL_THREAD, partial(fn, *args))


def weakly(method: Callable) -> Callable:
    """``method``, bound to an object that this callable does not keep alive.

    The coordinator hands its own methods to its hidden stack: held strongly, they
    would make reference cycles (the coordinator holds the stack), and a released
    coordinator would keep shard 0 and the hidden layers until the worker's next full
    garbage collection, where a next model might not find the memory.
    """
    ref = weakref.WeakMethod(method)
    name = method.__name__

    def call(*args):
        bound = ref()
        if bound is None:
            raise RuntimeError(f"{name}: its coordinator was released")
        return bound(*args)

    return call


class CallsShards:
    """Shard calls of :class:`~.coordinator.Coordinator`; what it uses of the
    coordinator is declared below."""

    # set by the host, the coordinator
    shard_workers: list[str]  #: the worker of each shard
    shards: list  #: their actors (shard 0: this worker's, in process)
    remote: list[bool]  #: whether each shard is on another worker
    tickets: TicketBook  #: numbers the calls that take turns
    worker: Any  #: this process's Dask worker
    step: int
    n_threads: int
    # its time counters, which these calls add to
    compute_seconds: float  #: this worker's hidden-layer arithmetic
    wait_seconds: float  #: waiting for the shards (overlapping waits once)
    shard_seconds: list[float]  #: each shard's answers, in all
    _waiting: tuple[int, float]  #: waits under way, and since when

    def _in_turn(self, i: int, method: str, *args):
        """Shard ``i``'s ``method(*args)``, started after the calls numbered before it
        (:mod:`.turns`); this worker's own shard needs no number: the caller awaits."""
        shard = self.shards[i]
        if not self.remote[i]:
            return getattr(shard, method)(*args)
        return shard.in_turn(self.tickets.ticket(i), method, *args)

    async def _compute(self, fn, *args):
        """Run model arithmetic on the kernel thread, like the local shard's methods, so
        numba kernels never run from two threads of this process at once."""
        return await on_kernel_thread(self._timed, fn, *args)

    def _timed(self, fn, *args):
        """``fn(*args)`` with this worker's threads, its time counted as hidden-layer work
        (not the wait for the actor thread)."""
        numba.set_num_threads(self.n_threads)
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.compute_seconds += time.perf_counter() - t0

    async def _all(self, calls: list, what: str) -> list:
        """Await actor calls to every shard; fail fast if a shard's worker is gone."""

        t0 = time.perf_counter()
        n, since = self._waiting
        self._waiting = (n + 1, t0 if n == 0 else since)

        async def wait(i, call):
            result = await call
            self.shard_seconds[i] += time.perf_counter() - t0
            return result

        tasks = [asyncio.ensure_future(wait(i, c)) for i, c in enumerate(calls)]
        try:
            while True:
                done, pending = await asyncio.wait(
                    tasks, timeout=POLL_SECONDS, return_when=asyncio.FIRST_EXCEPTION
                )
                for task in done:
                    if (error := task.exception()) is not None:
                        raise error
                if not pending:
                    return [t.result() for t in tasks]
                await self._check_alive(what)
        finally:
            n, since = self._waiting
            self._waiting = (n - 1, since)
            if n == 1:  # the last of overlapping waits (the pipeline's, a split layer's)
                self.wait_seconds += time.perf_counter() - since
            for task in tasks:
                task.cancel()

    async def _check_alive(self, what: str) -> None:
        listed = await scheduler_lists(self.worker.scheduler)  # None: no answer, no evidence
        gone = set() if listed is None else set(self.shard_workers) - set(listed)
        lost = [(s, w) for s, w in enumerate(self.shard_workers) if w in gone]
        if lost:
            names = ", ".join(f"shard {s} on {w}" for s, w in lost)
            raise ShardLostError(
                f"lost {names} during {what} of step {self.step + 1}: the worker died and "
                f"its part of the model with it"
            )

"""When a worker holding part of the model counts as lost: on evidence, never on one slow
or failed call.

A call that takes long (a loaded machine, a first call compiling kernels) or a scheduler
query that fails or times out says nothing about a worker. Two things do: the scheduler
no longer lists it (it removed the worker: its process died, or it missed heartbeats for
the scheduler's ``worker-ttl``), or it is listed but the scheduler's record of its last
heartbeat (``last_seen``) has not moved for ``lost_after`` seconds of our own clock (the
worker stopped answering; no clock of another machine is compared with ours).

Worker lists are asked for afresh each time, never read from ``Client.scheduler_info()``:
that returns the client's cache, which the client's periodic refresh overwrites with an
identity *without* its per-worker part, so a read racing that refresh sees no workers at
all, and a failed query leaves the cache stale without a word. On a loaded machine that
race declared both workers of a healthy run lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

#: Default seconds a listed worker's heartbeat may stand still before it counts as lost.
LOST_AFTER_SECONDS = 60.0
#: Seconds one query of the scheduler's worker list may take.
QUERY_SECONDS = 10.0


def workers_now(client, timeout: float = QUERY_SECONDS) -> dict[str, dict]:
    """The scheduler's workers (address -> its identity), asked now; raises if the
    scheduler does not answer within ``timeout`` seconds."""
    info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)
    return dict(info.get("workers") or {})


def listed_workers(client, timeout: float = QUERY_SECONDS) -> dict[str, dict] | None:
    """:func:`workers_now`, or None if the query failed: no evidence either way."""
    try:
        return workers_now(client, timeout)
    except Exception:  # noqa: BLE001 - a failed query (comm closed, timeout...) is no evidence
        return None


async def scheduler_lists(scheduler, timeout: float = QUERY_SECONDS) -> dict[str, dict] | None:
    """:func:`listed_workers` from within a worker (``scheduler``: its rpc to the
    scheduler)."""
    try:
        info = await asyncio.wait_for(scheduler.identity(n_workers=-1), timeout)
    except Exception:  # noqa: BLE001 - as listed_workers
        return None
    return dict(info.get("workers") or {})


def still_listed(client, workers: set[str]) -> set[str]:
    """Those of ``workers`` the scheduler still lists (all of them if it did not answer)."""
    listed = listed_workers(client)
    return set(workers) if listed is None else set(workers) & set(listed)


class Liveness:
    """Which workers the evidence says are gone; remembers each worker's heartbeat and
    since when (our clock) it has not moved."""

    def __init__(
        self, lost_after: float = LOST_AFTER_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not lost_after > 0:
            raise ValueError(f"lost_after must be a positive number of seconds, got {lost_after}")
        self.lost_after = float(lost_after)
        self.clock = clock
        self._beats: dict[str, tuple[object, float]] = {}

    def lost(self, workers: Iterable[str], listed: dict[str, dict] | None) -> set[str]:
        """Of ``workers``, those gone by ``listed`` (the scheduler's workers, as
        :func:`listed_workers` gives them; None, a failed query, is no evidence)."""
        if listed is None:
            return set()
        now = self.clock()
        gone = set()
        for worker in set(workers):
            info = listed.get(worker)
            if info is None:  # the scheduler removed it
                gone.add(worker)
                self._beats.pop(worker, None)
                continue
            beat = info.get("last_seen")
            seen = self._beats.get(worker)
            if beat is None:  # no heartbeat record: nothing to judge by
                continue
            if seen is None or seen[0] != beat:
                self._beats[worker] = (beat, now)
            elif now - seen[1] > self.lost_after:
                gone.add(worker)
        return gone

"""The transport of a live move's mirror phase (:mod:`dslide_dask.distributed.moves`;
the rows and their updates: :mod:`dslide_dask.model.mirror`).

Each old shard sends its messages straight to the new model's actors, without waiting
for them (an actor call; in the same process it runs at once): nothing goes through the
client, the scheduler or the coordinator, and no step waits on the network. A new shard
takes its messages on a thread of its own, so replaying them never holds the actor thread
that the worker's other actors (an old shard among them) share.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba

from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.mirror import BYTES_PER_STEP, MirrorMessage, Replica, RowMirror
from dslide_dask.model.wide_shard import WideShard

if TYPE_CHECKING:
    from dslide_dask.distributed.shard_actor import ShardActor


@dataclass(frozen=True)
class MirrorPlan:
    """Where an old model's shards stream their rows: the new layout and the actor of
    each new shard (shard 0: the new coordinator, which holds it)."""

    layout: ShardLayout
    targets: tuple


@dataclass(frozen=True)
class MirrorStatus:
    """How far a new shard has come: ready once every row is in and hashed."""

    ready: bool
    step: int  #: the old shards' step its rows are as of (-1: none yet)
    error: str | None = None  #: what taking a message raised (the move cannot go on)


#: Slices of rows (a step's) an old shard lets be under way at once: on a slow network
#: the rows go at its pace, rather than piling up in memory in messages waiting to go.
SLICES_IN_FLIGHT = 2
#: Bytes of rows copied out that an old shard holds at most while they stream.
BYTES_IN_FLIGHT = SLICES_IN_FLIGHT * BYTES_PER_STEP


class MirrorSender:
    """An old shard's :class:`~dslide_dask.model.mirror.RowMirror` and its receivers."""

    def __init__(self, shard: WideShard, plan: MirrorPlan) -> None:
        self.mirror = RowMirror(shard, plan.layout)
        # bound here, where the handles know their worker, for calls from any thread
        self.send = [target.mirror for target in plan.targets]
        self.calls: deque = deque()  # under way, with the step of the rows they carry

    def after_step(self, shard: WideShard, rest: bool = False) -> None:
        """Send what the step did, and more rows unless enough are under way (``rest``:
        every row not sent yet, no step taken)."""
        while self.calls and self.calls[0][0].done():  # a failed call: the move is dropped
            self.calls.popleft()
        slices = {step for call, step in self.calls if step is not None and not call.done()}
        for k, message in self.mirror.after_step(shard, rest, len(slices) < SLICES_IN_FLIGHT):
            rows = message.step if message.here is not None else None
            self.calls.append((self.send[k](message), rows))


class ReplicaFeed:
    """A new shard's :class:`~dslide_dask.model.mirror.Replica`, fed on its own thread."""

    def __init__(self, shard: WideShard, old: ShardLayout, n_threads: int) -> None:
        self.replica = Replica(shard, old)
        self.n_threads = n_threads
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="dslide-mirror", daemon=True)
        self.thread.start()

    def put(self, message: MirrorMessage) -> None:
        self.inbox.put(message)

    def status(self) -> MirrorStatus:
        return MirrorStatus(self.replica.ready, self.replica.step, self.error)

    def close(self) -> None:
        """Stop the thread once it has taken every message (training uses the shard next)."""
        self.stop()
        self.thread.join()

    def stop(self) -> None:
        """Let the thread end after the messages it has (without waiting for it)."""
        self.inbox.put(None)

    def _run(self) -> None:
        numba.set_num_threads(self.n_threads)
        while (message := self.inbox.get()) is not None:
            if self.error is None:
                try:
                    self.replica.take(message)
                except Exception as e:  # reported by status(); the trainer drops the move
                    self.error = f"{type(e).__name__}: {e}"


class MirrorsRows:
    """The coordinator's part: its shards (shard 0 here, the others remote) stream their
    rows to a new model, and the new coordinator's shard 0 takes its messages."""

    # set by the host, the coordinator
    shards: list  #: every shard's actor (shard 0's called in this process)
    local_shard: ShardActor  #: shard 0

    if TYPE_CHECKING:

        async def _all(self, calls: list, what: str) -> list: ...

    async def mirror_to(self, plan: MirrorPlan | None) -> None:
        """Start streaming every shard's rows to a new model (None: stop)."""
        await self._all([s.mirror_to(plan) for s in self.shards], "mirror")

    async def mirror_rest(self) -> None:
        """Send every row not sent yet, now (at a step boundary, no step in flight)."""
        await self._all([s.mirror_rest() for s in self.shards], "mirror")

    def mirror(self, message: MirrorMessage) -> None:
        self.local_shard.mirror(message)

    def mirror_status(self) -> MirrorStatus:
        return self.local_shard.mirror_status()

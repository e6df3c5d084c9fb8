"""How a training run follows the cluster: at step boundaries it moves the model off
workers asked to leave (:mod:`.policy`) and onto workers that joined, when that pays.

This module decides the moves, starts them (the prepare phase: the new model's actors,
:mod:`.handover`), records them and lets the old model go; :mod:`.switch` watches a
prepared model through the mirror phase and switches to it (the vocabulary and the
phases: :mod:`dslide_dask.distributed.moves`).

At the switch the new shards keep the tables they built from the mirrored rows: a few
steps old, they are as stale as tables are between two scheduled rebuilds (and redrawn
if the old shards redrew theirs). With bfloat16 moments (rounded by row index) or dense
Adam, the rows are not mirrored: they are copied with the rest at prepare and again at
the switch. Without room on the workers for both models, the move goes through a
checkpoint, and training stops throughout.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from dslide_dask.checkpoint import open_checkpoint
from dslide_dask.data.stream import Stream
from dslide_dask.distributed.liveness import listed_workers, still_listed
from dslide_dask.distributed.memory_plan import fits_while_moving, row_bytes
from dslide_dask.distributed.moves.handover import Handover, rows_crossing
from dslide_dask.distributed.moves.mirroring import BYTES_IN_FLIGHT
from dslide_dask.distributed.moves.policy import (
    STEPS_PER_CALL,
    ElasticPolicy,
    Move,
    join_pays,
    retire_requests,
)
from dslide_dask.distributed.moves.switch import PreparedMove, SwitchesModels
from dslide_dask.distributed.placement import Placement, shard_bytes
from dslide_dask.errors import MemoryPlanError
from dslide_dask.model.mirror import replayable

if TYPE_CHECKING:
    from collections.abc import Iterable

    from dslide_dask.checkpoint import CheckpointPolicy
    from dslide_dask.distributed.launch import Launch
    from dslide_dask.model.config import SlideConfig


class FollowsTheCluster(SwitchesModels):
    """The moves of :class:`~dslide_dask.distributed.trainer.DistributedTrainer`.

    Its state is set up by ``__init__``; what it uses of the trainer and its other parts
    besides what :class:`~.switch.SwitchesModels` declares is declared below."""

    # set by the host, the trainer: its settings and records
    cfg: SlideConfig
    n_labels: int
    n_shards_asked: int | None
    policy: CheckpointPolicy | None
    elastic: ElasticPolicy | None
    replace_wait: float
    moves: list[Move]
    _call_start: int  #: the step the training call began at
    # set by LaunchesModels
    _model_id: str
    _unused: frozenset[str]

    if TYPE_CHECKING:

        def close(self) -> None: ...
        def _workers(self) -> dict[str, dict]: ...
        def _place(
            self, workers: dict[str, dict], previous: Placement | None = None
        ) -> Placement: ...
        def _launch(
            self, restore: str | None, placement: Placement, handover: Handover | None = None
        ) -> Launch: ...
        def _start(
            self,
            restore: str | None,
            placement: Placement | None = None,
            handover: Handover | None = None,
        ) -> None: ...

    def __init__(self) -> None:
        super().__init__()
        #: workers asked to leave whose rows went (or are going) elsewhere
        self._left: set[str] = set()
        self._events_seen = 0.0  #: the newest request to leave read (a scheduler time)
        self._collect = False  #: released actors wait for a garbage collection
        self._to_retire: frozenset[str] = frozenset()  #: workers whose rows went, to retire

    def _follow_the_cluster(
        self, stream: Stream, n_points: int | None, finish: bool = False
    ) -> tuple[int, int] | None:
        """At a step boundary: switch to a prepared model once it stands (``finish``: wait
        for it; the data has run out), unless a worker it would keep was asked to leave
        meanwhile (then it is dropped: a leave does not wait for a join); else start moving
        the model off workers asked to leave, or onto workers that joined when that pays.
        The data position to go on from if the model was restarted from a checkpoint."""
        self._release_old_model()
        if self.elastic is None:
            return None
        listed = listed_workers(self.client)  # one query
        model = set(self.placement.workers)
        if listed is None or not model <= (alive := set(listed)):
            return None  # a lost worker (or no answer): the next call tells
        leaving: set[str] = set()
        seen = self._events_seen
        if self.elastic.leave:
            events = self.client.get_events("all")
            leaving = retire_requests(events, seen) & model
            seen = max((t for t, _ in events), default=seen)
        if self._prepared is not None:
            if leaving <= self._prepared.leaving:
                if self._await_prepared() if finish else self._prepared_stands(alive):
                    self._switch()  # the new coordinator goes on with the old one's data
                return None
            self._drop_prepared(stop_mirror=True)  # and move with the workers that must go
        workers = alive - self._left - self._unfit  # as _workers() sees them
        joined = workers - model - self._unused - leaving
        if not leaving and not (joined and self._join_pays(stream, n_points, len(joined))):
            return None
        return self._move(leaving, joined, seen)

    def rebalance(self, wait: bool = True) -> Move | None:
        """Between training calls: move the model onto the workers there are now (those
        that joined included), worker to worker; the move, or None if there was nothing to
        do (or no room to move live and no checkpoint store). ``wait=False``: only start
        preparing it; training calls switch to it once it stands if the trainer follows
        the cluster (``elastic``), and a later call of this finishes it in any case."""
        if self._prepared is None:
            joined = set(self._workers()) - set(self.placement.workers)
            if not joined:
                return None
            moves = len(self.moves)
            self._move(set(), joined, self._events_seen)
            if len(self.moves) > moves:  # moved through a checkpoint
                return self.moves[-1]
        if self._prepared is None or not wait or not self._await_prepared():
            return None
        self._switch()
        return self.moves[-1]

    def _join_pays(self, stream: Stream, n_points: int | None, n_new: int) -> bool:
        elastic = self.elastic
        if elastic is None or not elastic.join or self.n_shards_asked is not None:
            return False
        recent = self.history[-STEPS_PER_CALL:]
        step_seconds = sum(s["seconds"] for s in recent) / max(1, len(recent))
        remaining = 1 << 40  # a stream from storage: its length is not known here
        if n_points is not None:
            total = stream.epochs * -(-n_points // stream.batch_size) - stream.first_batch
            remaining = total - (self.step - self._call_start)
        n_now = len(self.placement.workers)
        if self.moves:
            move_seconds = self.moves[-1].cost_seconds
        else:  # about the new workers' share of the model crosses the network
            moving = shard_bytes(self.cfg, self.n_labels) * n_new / (n_now + n_new)
            move_seconds = moving / elastic.move_bytes_per_second
        return join_pays(
            remaining,
            step_seconds,
            workers_now=n_now,
            workers_then=n_now + n_new,
            move_seconds=move_seconds,
        )

    def _move(self, leaving: set[str], joined: set[str], seen: float) -> tuple[int, int] | None:
        """Re-balance the model over the workers there are, less ``leaving`` (asked to
        leave by the requests up to ``seen``; later ones are read after the move): start
        preparing a live move (:attr:`_prepared`) when every worker can hold its old and
        new parts at once, else move through a checkpoint now. The data position to go on
        from if the model moved now; None otherwise, and if it cannot move: the workers
        that would stay cannot hold the model, or there is no room for a live move and no
        checkpoint store (a worker asked to leave then stays, as Dask alone would keep it)."""
        t0 = time.perf_counter()
        at_step, old = self.step, self.placement
        staying = {a: w for a, w in self._workers().items() if a not in leaving}
        try:
            new = self._place(staying, old)
        except MemoryPlanError:
            return None
        mirrored = replayable(self.cfg)
        copied = BYTES_IN_FLIGHT if mirrored else None
        live = (self.elastic is None or self.elastic.live) and (
            old.plan is None or new.plan is None or fits_while_moving(old.plan, new.plan, copied)
        )
        if not live and self.policy is None:
            return None
        self._left |= leaving
        crossing = rows_crossing(old, new)
        if live:
            handover = Handover(self._model_id, old.layout, old.workers, old.hidden_units, mirrored)
            self._prepared = PreparedMove(
                self._launch(None, new, handover),
                handover,
                frozenset(leaving),
                frozenset(joined),
                at_step,
                t0,
                crossing,
                seen,
            )
            return None
        policy = self.policy
        assert policy is not None, "a move through a checkpoint without a store"
        url = self._wait(self.coordinator.save_checkpoint(policy.store()))
        meta = open_checkpoint(url, policy.storage_options).meta
        self.close()
        self._start(url, new)  # on the workers that stay, before any of them may go
        self._moved(
            leaving,
            joined,
            seen,
            at_step=at_step,
            seconds=time.perf_counter() - t0,
            live=False,
            rows_moved=crossing,
        )
        return meta["position"]["epoch"], meta["position"]["batch"]

    def _let_go(self) -> None:
        """Between handing the coordinator its next steps and waiting for them (or as a
        training call ends): collect the actors let go at the boundary, then retire the
        workers whose rows went (Dask retires a worker once it forgot its actors), so
        that neither stops training."""
        if self._collect:
            self._collect = False
            time.sleep(0.01)  # the call just made leaves before the collection holds the GIL
            gc.collect()
        if self._to_retire:
            leaving, self._to_retire = self._to_retire, frozenset()
            self._retire(set(leaving))

    def _moved(
        self,
        leaving: Iterable[str],
        joined: Iterable[str],
        seen: float,
        *,
        rows_moved: int,
        **how: Any,
    ) -> None:
        """Record the move; the workers that left are retired while the next steps run
        (:meth:`_let_go`). Requests to leave after ``seen`` (while the move was prepared)
        are read at the next boundary."""
        self._to_retire |= frozenset(leaving)  # retired while the next steps run
        self._events_seen = seen
        self.moves.append(
            Move(
                leaving=tuple(sorted(leaving)),
                joined=tuple(sorted(joined)),
                workers=len(self.placement.workers),
                rows_moved=rows_moved,
                bytes_moved=rows_moved * row_bytes(self.cfg),
                **how,
            )
        )

    def _retire(self, leaving: set[str]) -> None:
        """Retire the workers whose rows were handed off, as they were asked to (once
        the scheduler has forgotten the released actors, it lets them go)."""
        deadline = time.monotonic() + self.replace_wait
        pending = set(leaving)
        while pending and time.monotonic() < deadline:
            pending -= set(self.client.retire_workers(list(pending)))
            pending = still_listed(self.client, pending)
            if pending:
                time.sleep(0.1)

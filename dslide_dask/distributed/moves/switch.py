"""The mirror and switch phases of a live move (the vocabulary:
:mod:`dslide_dask.distributed.moves`): the prepared model is watched until it stands and
its shards hold the rows the old shards stream to them, then training switches to it, or
it is dropped (a worker lost, a build or a replay failed) and the run goes on with the
model it has.

Apart from :mod:`.rebalance`, which decides when and where to move, because waiting on a
model being built and switching to it is its own job, with its own failure modes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distributed import wait

from dslide_dask.distributed.errors import POLL_SECONDS
from dslide_dask.distributed.launch import Launch
from dslide_dask.distributed.liveness import listed_workers
from dslide_dask.distributed.moves.handover import Handover, HandoverPieces
from dslide_dask.distributed.moves.mirroring import MirrorPlan
from dslide_dask.distributed.moves.policy import STEPS_PER_CALL
from dslide_dask.distributed.placement import Placement
from dslide_dask.errors import MirrorFailed, ShardLostError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from distributed import Client

#: How long a switch waits for the new shards to replay the last step before the move is
#: dropped (a replay takes tens of milliseconds; this only guards against a hang).
CATCH_UP_SECONDS = 60


@dataclass(frozen=True)
class PreparedMove:
    """A live move being prepared: the new model built from the old one's parts."""

    launch: Launch
    old: Handover
    leaving: frozenset[str]
    joined: frozenset[str]
    at_step: int  #: when the copy it is built from was taken
    started: float  #: ``time.perf_counter()`` then
    rows_moved: int  #: output rows whose worker changes
    events_seen: float  #: the newest leave request read when the move was decided


class SwitchesModels:
    """Prepared models of :class:`~.rebalance.FollowsTheCluster`, watched and switched to.

    Its state is set up by ``__init__``; what it uses of its host
    (:class:`~dslide_dask.distributed.trainer.DistributedTrainer` and its other parts) is
    declared below."""

    # set by the host, the trainer
    client: Client
    coordinator: Any  #: the coordinator actor's handle
    history: list[dict]
    # set by LaunchesModels
    placement: Placement  #: where the model in use is
    _futures: list  #: the actors of the model in use
    # set by FollowsTheCluster
    _left: set[str]
    _events_seen: float

    if TYPE_CHECKING:

        @property
        def step(self) -> int: ...
        def _wait(self, future: Any) -> Any: ...
        def _release(self, futures: list, now: bool = True) -> None: ...
        def _lost(self) -> list[tuple[int, str]]: ...
        def _lost_message(self, lost: list[tuple[int, str]]) -> str: ...
        def _adopt(self, launch: Launch) -> None: ...
        def _moved(
            self,
            leaving: Iterable[str],
            joined: Iterable[str],
            seen: float,
            *,
            rows_moved: int,
            **how: Any,
        ) -> None: ...

    def __init__(self) -> None:
        super().__init__()
        self._prepared: PreparedMove | None = None
        self._old_model: list = []  #: the actors of the model switched from, until released
        self._old_coordinator: Any = None  #: its coordinator's handle, until released
        #: the new model's placement, while it takes the old one's parts
        self._moving_to: Placement | None = None
        #: joined workers a new model could not be built on
        self._unfit: frozenset[str] = frozenset()
        self._mirroring = False  #: the old shards stream their rows to the prepared model

    def _prepared_stands(self, alive: set[str], rest: bool = False) -> bool:
        """Whether every actor of the prepared model stands and holds the rows as of the
        step before or later (``rest``: no step will come; as of now). A prepared model
        that lost a worker is dropped (a later boundary may move again), and so is one
        that could not be built (:meth:`_unbuilt`)."""
        prepared = self._prepared
        assert prepared is not None, "no move is being prepared"
        futures = prepared.launch.futures
        if not set(prepared.launch.placement.workers) <= alive:
            self._drop_prepared(stop_mirror=True)
            return False
        if failed := [f for f in futures if f.status == "error"]:
            error = failed[0].exception()  # before the release
            self._drop_prepared(stop_mirror=True)
            self._unbuilt(prepared, error)
            return False
        if not all(f.done() for f in futures):
            return False
        if not prepared.old.mirrored:
            return True
        if not self._mirroring:  # the new actors stand: the old shards start streaming
            plan = MirrorPlan(prepared.launch.placement.layout, tuple(f.result() for f in futures))
            self._wait(self.coordinator.mirror_to(plan))
            self._mirroring = True
        if rest:
            self._wait(self.coordinator.mirror_rest())  # no-op once every row went
        try:
            return self._replicas_at(prepared, self.step - (0 if rest else 1))
        except MirrorFailed as error:
            self._mirror_failed(error)
            return False

    def _replicas_at(self, prepared: PreparedMove, step: int) -> bool:
        """Whether every new shard of ``prepared`` holds the rows as of ``step`` or later."""
        calls = [f.result().mirror_status() for f in prepared.launch.futures]
        try:
            statuses = [self._wait(call) for call in calls]
        except ShardLostError:
            raise  # a worker of the model in use: it is restored
        except Exception as e:  # a new worker's: the move cannot go on
            raise MirrorFailed(f"{type(e).__name__}: {e}") from e
        if error := next((s.error for s in statuses if s.error), None):
            raise MirrorFailed(error)
        return all(s.ready and s.step >= step for s in statuses)

    def _caught_up(self, prepared: PreparedMove) -> bool:
        """Wait until every new shard has replayed the last step (its update is on its
        way: tens of milliseconds); False if the move was dropped instead."""
        deadline = time.monotonic() + CATCH_UP_SECONDS
        try:
            while not self._replicas_at(prepared, self.step):
                if time.monotonic() > deadline:
                    raise MirrorFailed(
                        f"the new shards did not replay step {self.step} "
                        f"within {CATCH_UP_SECONDS} s"
                    )
                time.sleep(0.002)
        except MirrorFailed as error:
            self._mirror_failed(error)
            return False
        return True

    def _mirror_failed(self, error: MirrorFailed) -> None:
        prepared = self._prepared
        assert prepared is not None, "no move is being prepared"
        self._drop_prepared(stop_mirror=True)
        self._unbuilt(prepared, error)

    def _unbuilt(self, prepared: PreparedMove, error: BaseException) -> None:
        """A new model failed to build (a joined node without room or with a broken
        environment): the run goes on with the model it has, rather than stopping or
        going back to a checkpoint. The workers that joined for it are not tried again;
        workers asked to leave stay, as when the others cannot hold the model (a new
        request tries again)."""
        self._unfit = self._unfit | prepared.joined
        self._events_seen = max(self._events_seen, prepared.events_seen)
        warnings.warn(
            f"could not build the model on {len(prepared.launch.placement.workers)} workers "
            f"({type(error).__name__}: {error}); training goes on on the "
            f"{len(self.placement.workers)} it has"
            + (f", without {', '.join(sorted(prepared.joined))}" if prepared.joined else "")
            + (f"; {', '.join(sorted(prepared.leaving))} stay" if prepared.leaving else ""),
            RuntimeWarning,
            stacklevel=2,
        )

    def _await_prepared(self) -> bool:
        """Wait until the prepared model stands (True) or is dropped (False); raises if a
        worker of the model in use is lost meanwhile."""
        while (prepared := self._prepared) is not None:
            try:
                wait(list(prepared.launch.futures), timeout=POLL_SECONDS)
            except TimeoutError:
                if lost := self._lost():
                    raise ShardLostError(self._lost_message(lost)) from None
            alive = listed_workers(self.client)
            if alive is not None and self._prepared_stands(set(alive), rest=True):
                return True
            if self._mirroring:
                time.sleep(0.02)  # the new shards are taking the rows
        return False

    def _switch(self) -> None:
        """Train on with the prepared model, once its shards replayed the last step (if
        the rows were streamed): copy the old parts into it again (with the data and the
        position in it) if the old model took steps since the first copy; let the old
        model go."""
        t0 = time.perf_counter()
        prepared = self._prepared
        assert prepared is not None, "no move is being prepared"
        if self._mirroring and not self._caught_up(prepared):
            return
        self._prepared = None
        launch = prepared.launch
        self._moving_to = launch.placement  # a lost new worker fails the waits below
        try:
            if self.step > prepared.at_step:
                pieces = HandoverPieces(
                    self.client, prepared.old, launch.placement, f"{launch.token}-switch"
                )
                for future in pieces.settle(launch.token):
                    self._wait(future)
        except BaseException:  # the old model is recovered; the workers leaving ask again
            self._left -= prepared.leaving
            self._release(list(launch.futures))
            raise
        finally:
            self._moving_to = None
            self._mirroring = False
        self._old_model = self._futures  # let go at the next boundary, not now
        self._old_coordinator = self.coordinator
        self._adopt(launch)
        if prepared.leaving:
            self._release_old_model()  # before the workers that left may retire
        n = self.step - prepared.at_step
        self._moved(
            prepared.leaving,
            prepared.joined,
            prepared.events_seen,
            at_step=self.step,
            seconds=time.perf_counter() - t0,
            live=True,
            rows_moved=prepared.rows_moved,
            prepare_seconds=t0 - prepared.started,
            steps_while_preparing=n,
            slowdown_seconds=self._slowdown(n),
        )

    def _slowdown(self, n: int) -> float:
        """How much longer the last ``n`` steps took than the median step before them."""
        if n <= 0 or len(self.history) <= n:
            return 0.0
        before = [s["seconds"] for s in self.history[-n - STEPS_PER_CALL : -n]]
        during = sum(s["seconds"] for s in self.history[-n:])
        return max(0.0, during - n * statistics.median(before))

    def _release_old_model(self) -> None:
        """Free the old model on its workers (as ``close`` frees a model), then let its
        actors go."""
        if self._old_model:
            old, self._old_model = self._old_model, []
            coordinator, self._old_coordinator = self._old_coordinator, None
            self._free(coordinator)
            self._release(old, now=False)

    def _free(self, coordinator: Any) -> None:
        """Have a model's coordinator drop its arrays and its shards' now (before their
        actors go); a worker already lost took its part with it."""
        if coordinator is not None:
            with contextlib.suppress(Exception):
                self._wait(coordinator.close())

    def _drop_prepared(self, stop_mirror: bool = False) -> None:
        """Release a prepared model that will not be switched to; the workers it was to
        take off are asked again (their requests stand). ``stop_mirror``: the old model
        trains on, and stops streaming its rows."""
        prepared, self._prepared = self._prepared, None
        if stop_mirror and self._mirroring:
            self._wait(self.coordinator.mirror_to(None))
        self._mirroring = False
        if prepared is not None:
            self._left -= prepared.leaving
            self._release(list(prepared.launch.futures))

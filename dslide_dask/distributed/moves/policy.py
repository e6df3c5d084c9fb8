"""Workers that leave or join mid-run: who is asked to go, when moving onto new workers
pays, and what a move was (:class:`Move`; the vocabulary:
:mod:`dslide_dask.distributed.moves`).

Dask does not retire a worker that holds an actor: ``Client.retire_workers`` (and
``dslide leave``, a Kubernetes preStop hook) gives up at once and logs a
``retire-workers`` event naming it under ``could-not-retire``. That event, read from the
scheduler's public event log, is our notice (a retirement that was attempted, never a
scaler's question: :class:`KeepShardWorkers` keeps shard workers from scalers): the
trainer re-balances the model onto the workers that stay (worker to worker,
:mod:`.rebalance`; through a checkpoint when the workers have no room for two copies of
their part), releases the old actors, retires the worker itself (now it can) and goes on
from the same step. No step is redone. A worker that joins is used the same
way when :func:`join_pays` says the time saved outweighs the move.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from distributed import SchedulerPlugin

from dslide_dask.distributed.liveness import still_listed, workers_now

#: Steps per coordinator call: the step boundaries where the model can move.
STEPS_PER_CALL = 10


@dataclass(frozen=True)
class ElasticPolicy:
    """How a run treats workers that come and go.

    ``leave``: hand a retiring worker's rows off (re-balance, go on) instead of
    blocking its retirement. ``join``: re-balance onto workers that join when
    :func:`join_pays`; ``move_bytes_per_second`` prices a move before one was measured
    (the rows bound for the new workers cross the network once). ``live``: move worker
    to worker when every worker has room for its old and new parts at once; False:
    always through the checkpoint store (when memory limits understate what else runs
    on the nodes).
    """

    leave: bool = True
    join: bool = True
    move_bytes_per_second: float = 200e6
    live: bool = True


#: How long a retirement Dask gave up on holds every other scale-down back (the run hands
#: the worker's rows off at its next step boundary and then retires it).
HAND_OFF_SECONDS = 600.0
#: After a hand-off, how long the scaler may pick no worker: its view of the cluster
#: (a cluster object's copy of the scheduler's) still counts the worker that left.
SETTLE_SECONDS = 10.0


def retire_requests(events, since: float) -> set[str]:
    """Addresses asked to leave since ``since`` (a scheduler time stamp): those whose
    retirement the scheduler gave up on, in ``Client.get_events("all")``'s ``(time,
    message)`` pairs. Only a retirement that was attempted counts: a scaler's question
    (which workers could close?) asks nothing of the run."""
    asked: set[str] = set()
    for stamp, msg in events:
        if stamp < since or not isinstance(msg, dict):
            continue
        if msg.get("action") == "retire-workers":
            asked.update(msg.get("could-not-retire") or ())
    return asked


class KeepShardWorkers(SchedulerPlugin):
    """Scheduler plugin: a scaler (``cluster.adapt``, the Kubernetes operator) may not
    pick a worker that holds a shard, which it would close by force once its polite
    retirement failed; and while a worker's rows are being handed off, it may pick no
    worker at all (the workers that stay hold no shard for a moment and would look free).

    ``valid_workers_downscaling`` only answers: Dask also asks it for
    ``adaptive_target()``, which every scrape of the dashboard's ``/metrics`` and of
    ``/api/v1/adaptive_target`` computes, so it must change nothing. A hand-off is known
    from a retirement that was really attempted: a ``retire-workers`` event naming a
    worker that holds an actor under ``could-not-retire`` (``client.retire_workers``,
    ``dslide leave``), which the trainer reads too."""

    name = "dslide-keep-shard-workers"
    idempotent = True  # one per scheduler, kept across trainers (a hand-off may be under way)

    def __init__(self) -> None:
        self.scheduler = None
        self.asked: dict[str, float] = {}  #: retirements refused (when), not gone yet
        self.settled_at = 0.0  #: when the scaler may pick workers again

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def valid_workers_downscaling(self, scheduler, workers: list) -> list:
        if self._handing_off(scheduler) or time.time() < self.settled_at:
            return []
        return [ws for ws in workers if not ws.actors]

    def _handing_off(self, scheduler) -> bool:
        now = time.time()
        self.asked = {
            a: t
            for a, t in self.asked.items()
            if now - t < HAND_OFF_SECONDS and a in scheduler.workers
        }
        return bool(self.asked)

    def log_event(self, topic: str, msg) -> None:
        if topic != "all" or not isinstance(msg, dict) or msg.get("action") != "retire-workers":
            return
        workers = getattr(self.scheduler, "workers", {})
        for address in msg.get("could-not-retire") or ():
            ws = workers.get(address)
            if ws is not None and ws.actors:  # a shard (or another actor): the run moves it
                self.asked[address] = time.time()

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        if self.asked.pop(worker, None) is not None:
            self.settled_at = time.time() + SETTLE_SECONDS


def leave(
    client, who: str, timeout: float, poll: float = 1.0, *, stated: float | None = None
) -> list[str]:
    """Retire the workers ``who`` names (an address, a worker name or a host), letting a
    training run hand their rows off first; the addresses, once gone ([]: no such worker).

    For a worker that is about to be stopped (a Kubernetes preStop hook, a spot-instance
    notice): Dask will not retire a worker holding part of a model, and the run takes
    that refusal as its notice; at its next step boundary it moves the model off the
    worker and retires it. Raises TimeoutError if a worker is still there after
    ``timeout`` seconds (no run took the hand-off); its message gives ``stated`` (the
    whole time the caller was given, connecting included) when set."""
    workers = workers_now(client)
    named = [a for a, w in workers.items() if who in (a, str(w.get("name")), w.get("host"))]
    deadline = time.monotonic() + timeout
    pending = set(named)
    while pending:
        pending -= set(client.retire_workers(sorted(pending)))  # {} while it holds a shard
        pending = still_listed(client, pending)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(
                f"{', '.join(sorted(pending))} still there after "
                f"{timeout if stated is None else stated:g} s: no training "
                f"run took its rows (a run loses them with the worker and restores its "
                f"last checkpoint)"
            )
        if pending:
            time.sleep(poll)
    return named


def join_pays(
    remaining_steps: int,
    step_seconds: float,
    *,
    workers_now: int,
    workers_then: int,
    move_seconds: float,
) -> bool:
    """Whether moving onto ``workers_then`` workers from ``workers_now`` saves more time
    than the move costs, twice over.

    The output layer's work divides over the shards, so a step would take about
    ``workers_now / workers_then`` of its time (an upper bound on the gain: the
    coordinator's share does not shrink); the move costs ``move_seconds``.
    """
    if workers_then <= workers_now or remaining_steps <= 0:
        return False
    saved = remaining_steps * step_seconds * (1 - workers_now / workers_then)
    return saved > 2 * move_seconds


@dataclass(frozen=True)
class Move:
    """The model moved at a step boundary, off workers asked to leave and/or onto
    workers that joined. No step is redone. ``seconds``: how long training stopped."""

    at_step: int
    leaving: tuple[str, ...]
    joined: tuple[str, ...]
    workers: int  #: shards after the move
    seconds: float
    live: bool = True  #: worker to worker; False: through a checkpoint
    rows_moved: int = 0  #: output rows whose worker changed
    bytes_moved: int = 0  #: their weights and optimiser state
    #: a live move: from when the new model was started to when training stopped for the
    #: switch (``seconds``: the switch, training paused); the steps taken meanwhile, and
    #: how much longer they took than the steps before (the preparing shared their cores)
    prepare_seconds: float = 0.0
    steps_while_preparing: int = 0
    slowdown_seconds: float = 0.0

    @property
    def cost_seconds(self) -> float:
        """What the move cost the run: the pause and the slowdown while preparing."""
        return self.seconds + self.slowdown_seconds

    @property
    def began_at(self) -> int:
        """The step boundary where the move began."""
        return self.at_step - self.steps_while_preparing


def last_event(client) -> float:
    """The scheduler's time stamp of the newest event that could ask for a hand-off."""
    return max((t for t, _ in client.get_events("all")), default=0.0)

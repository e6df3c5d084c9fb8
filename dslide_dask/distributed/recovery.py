"""Surviving a worker lost mid-run: the model goes back to its latest checkpoint on the
workers there are (waiting a while for a replacement) and training goes on from that
checkpoint's data position."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dslide_dask.data.stream import Stream
from dslide_dask.distributed.liveness import listed_workers
from dslide_dask.errors import ShardLostError

if TYPE_CHECKING:
    from distributed import Client

    from dslide_dask.checkpoint import CheckpointPolicy
    from dslide_dask.distributed.liveness import Liveness
    from dslide_dask.distributed.placement import Placement


@dataclass
class Recovery:
    """A lost worker survived: what was lost, and what was redone."""

    lost: str  #: which shards on which workers
    at_step: int  #: steps done when the loss was noticed
    restored_step: int  #: the checkpoint training went back to (0: the start)
    workers: int  #: workers the model was placed on afterwards
    seconds: float  #: time from noticing the loss to training again

    @property
    def redone(self) -> int:
        return self.at_step - self.restored_step


class SurvivesLostWorkers:
    """The recoveries of :class:`~dslide_dask.distributed.trainer.DistributedTrainer`;
    what it uses of the trainer and its other parts is declared below."""

    # set by the host, the trainer: its settings and records
    client: Client
    policy: CheckpointPolicy | None
    max_recoveries: int
    replace_wait: float
    liveness: Liveness
    recoveries: list[Recovery]
    history: list[dict]
    start_step: int
    # set by LaunchesModels (the model in use) and SwitchesModels (the one a move builds)
    placement: Placement
    _moving_to: Placement | None

    if TYPE_CHECKING:

        @property
        def step(self) -> int: ...
        def close(self) -> None: ...
        def _start(self, restore: str | None) -> None: ...

    def _recover(self, err: Exception, start_len: int, stream: Stream) -> tuple[int, int]:
        """After ``err``: if a model worker was lost and a checkpoint (or this call's
        start, when nothing came before) can stand in for it, rebuild the model there;
        the data position to go on from. Otherwise raise."""
        lost = self._lost()
        if not lost and isinstance(err, OSError):  # a broken connection: is a worker gone?
            deadline = time.monotonic() + self.replace_wait
            while not lost and time.monotonic() < deadline:
                time.sleep(0.25)
                lost = self._lost()
        if not lost or self.policy is None or len(self.recoveries) >= self.max_recoveries:
            if lost and not isinstance(err, ShardLostError):
                raise ShardLostError(self._lost_message(lost)) from err
            raise err
        t0 = time.perf_counter()
        at_step = self.step
        ckpt = self.policy.store().latest()
        call_start = self.start_step + start_len
        if (ckpt is None and call_start > 0) or (ckpt is not None and ckpt.step < call_start):
            raise ShardLostError(
                self._lost_message(lost) + f"; no checkpoint since this training call began "
                f"(step {call_start}) to recover from"
            ) from err
        self.close()
        self._await_replacements(len(self.placement.workers))
        if ckpt is None:  # back to this call's start: a fresh model
            restored, position, restore = 0, (stream.first_epoch, stream.first_batch), None
        else:
            restored, restore = ckpt.step, ckpt.url
            position = (ckpt.meta["position"]["epoch"], ckpt.meta["position"]["batch"])
        del self.history[max(start_len, restored - self.start_step) :]
        self._start(restore)
        self.recoveries.append(
            Recovery(
                lost=", ".join(f"shard {s} on {w}" for s, w in lost),
                at_step=at_step,
                restored_step=restored,
                workers=len(self.placement.workers),
                seconds=time.perf_counter() - t0,
            )
        )
        return position

    def _await_replacements(self, wanted: int) -> None:
        """Give a lost worker up to ``replace_wait`` seconds to be replaced (a nanny
        restarting it, an autoscaler adding a node)."""
        deadline = time.monotonic() + self.replace_wait
        while time.monotonic() < deadline:
            if len(listed_workers(self.client) or ()) >= wanted:
                return
            time.sleep(0.25)

    def _lost(self) -> list[tuple[int, str]]:
        """``(shard, worker)`` of every shard whose worker is gone, on evidence (the
        scheduler removed it, or its heartbeat stood still for ``lost_after`` seconds:
        :mod:`.liveness`); a slow call or a failed query of the scheduler is none."""
        models = [self.placement.workers]
        if self._moving_to is not None:  # the new model is taking the old one's parts
            models.append(self._moving_to.workers)
        gone = self.liveness.lost({w for m in models for w in m}, listed_workers(self.client))
        return sorted({(s, w) for m in models for s, w in enumerate(m) if w in gone})

    def _lost_message(self, lost: list[tuple[int, str]]) -> str:
        names = ", ".join(f"shard {s} on {w}" for s, w in lost)
        return (
            f"lost {names} after {self.step} steps: the worker died and its part of the "
            f"model with it"
        )

"""The Dask actor that holds one shard of the wide layer: a thin shell over WideShard."""

from __future__ import annotations

import asyncio
import time
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Any

import numba
import numpy as np
from distributed import get_worker

from dslide_dask.checkpoint import Folder, open_checkpoint
from dslide_dask.checkpoint.model import restore_hidden, restore_shard, write_hidden, write_shard
from dslide_dask.data.csr import CSR
from dslide_dask.distributed.moves.handover import RowsPiece, UnitsPiece, take_rows, take_units
from dslide_dask.distributed.moves.mirroring import (
    MirrorPlan,
    MirrorSender,
    MirrorStatus,
    ReplicaFeed,
)
from dslide_dask.distributed.registry import register
from dslide_dask.distributed.specs import ShardSpec
from dslide_dask.distributed.turns import Ticket, Turns
from dslide_dask.distributed.worker_process import prepare_worker_process
from dslide_dask.model.hidden import HiddenLayers
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.mirror import MirrorMessage
from dslide_dask.model.wide_shard import ActiveSets, SoftmaxPartials, WideShard
from dslide_dask.model.wire import Packed, pack, unpack


class ShardActor:
    """Weights, optimiser state and LSH tables of one shard, built and kept on its worker.

    Methods run on the worker's single actor thread; numba uses ``spec.n_threads`` of
    them. Activations arrive and gradients leave packed (:mod:`dslide_dask.model.wire`).
    With ``spec.restore`` (a checkpoint URL) the shard loads its rows from there, whatever
    sharding wrote them; checkpoints are written by the shard straight to storage. With
    ``spec.handover``, ``pieces`` are its rows from the shards of a live model
    (:mod:`~dslide_dask.distributed.moves.handover`), by old shard index, and ``units`` those of
    the hidden layer's units it holds; a mirrored handover brings no rows: the old shards
    stream them (:mod:`~dslide_dask.distributed.moves.mirroring`).
    """

    def __init__(
        self,
        spec: ShardSpec,
        pieces: dict[int, RowsPiece] | None = None,
        units: list[UnitsPiece] | None = None,
    ) -> None:
        prepare_worker_process()
        self.n_threads = spec.n_threads
        self.wire_dtype = spec.wire_dtype
        numba.set_num_threads(spec.n_threads)
        fresh = spec.restore is None and spec.handover is None
        self.shard = WideShard(
            spec.cfg, spec.dim_in, spec.layout, spec.shard_index, initialize=fresh
        )
        self.hidden: HiddenLayers | None = None  # a slice of the hidden layer, if any here
        if spec.hidden_units is not None:
            self.hidden = HiddenLayers(
                spec.cfg,
                spec.n_features,
                spec.cfg.seed,
                initialize=fresh,
                columns=spec.hidden_units,
            )
        if spec.restore is not None:
            ckpt = open_checkpoint(spec.restore, spec.storage_options)
            restore_shard(ckpt, self.shard, moments=not spec.answering)
            if self.hidden is not None:
                restore_hidden(ckpt, self.hidden, moments=not spec.answering)
        elif spec.handover is not None:
            if not spec.handover.mirrored:
                take_rows(self.shard, spec.handover.layout, pieces or {})
            if self.hidden is not None:
                take_units(self.hidden, units or [])
        self._feed: ReplicaFeed | None = None  # the old shards' rows, while they stream them
        if spec.handover is not None and spec.handover.mirrored:
            self._feed = ReplicaFeed(self.shard, spec.handover.layout, spec.n_threads)
            weakref.finalize(self, self._feed.stop)  # a dropped move's thread ends with it
        self._mirror: MirrorSender | None = None  # where this shard streams its rows to
        self._inputs: dict[int, tuple] = {}  # a step's input and activations, for backward
        self._turns = Turns()
        self.busy_seconds = 0.0
        self.calls = 0
        register(spec.model_id, spec.shard_index, self)

    def settle(self, old: ShardLayout, piece: dict | list) -> None:
        """Take one piece of the live model this shard was built from again, as it is
        now: rows (keeping the tables) or hidden units (:func:`~.handover.settle`)."""
        if isinstance(piece, dict):
            take_rows(self.shard, old, piece, rehash=False, some=True)
        else:
            take_units(self._units(), piece, adopt=True)

    def mirror_to(self, plan: MirrorPlan | None) -> None:
        """Stream this shard's rows, and then each step's update of them, to a new
        model's shards (None: stop)."""
        self.shard.keep_updates = False
        self._mirror = None if plan is None else MirrorSender(self.shard, plan)

    def mirror_rest(self) -> None:
        """Send every row not sent yet (between steps)."""
        if self._mirror is not None:
            self._mirror.after_step(self.shard, rest=True)

    def mirror(self, message: MirrorMessage) -> None:
        """A message of an old shard streaming its rows here (queued: returns at once)."""
        if self._feed is None:
            raise RuntimeError("no move streams rows to this shard")
        self._feed.put(message)

    def mirror_status(self) -> MirrorStatus:
        if self._feed is None:  # taken over, or never streamed to
            return MirrorStatus(True, self.shard.step)
        return self._feed.status()

    async def in_turn(self, ticket: Ticket, method: str, *args) -> Any:
        """``forward`` or ``backward`` in the order of ``ticket`` (:mod:`.turns`), on the
        worker's actor thread like every other call here."""
        if method not in ("forward", "backward"):
            raise ValueError(f"only forward and backward take turns, not {method!r}")
        call = partial(getattr(self, method), *args)
        actor_thread = get_worker().executors["actor"]
        loop = asyncio.get_running_loop()
        return await self._turns.run(ticket, lambda: loop.run_in_executor(actor_thread, call))

    def forward(self, h: Packed, Y: CSR) -> SoftmaxPartials:
        with self._busy():
            return self.shard.forward(unpack(h), Y)

    def hash(self, h: Packed, Y: CSR) -> ActiveSets:
        """:meth:`forward`'s first half (graph step mode)."""
        with self._busy():
            return self.shard.hash(unpack(h), Y)

    def gather(self, active_sets: ActiveSets) -> SoftmaxPartials:
        """:meth:`forward`'s second half (graph step mode)."""
        with self._busy():
            return self.shard.gather(active_sets)

    def hidden_forward(self, X: CSR, key: int | None) -> np.ndarray:
        """This worker's units of the hidden layer for ``X`` (float32: the coordinator
        packs the whole vector); kept for :meth:`hidden_backward` under ``key``."""
        with self._busy():
            h, acts = self._units().forward(X)
            if key is not None:
                self._inputs[key] = (X, acts)
                while len(self._inputs) > 2:  # the pipeline's depth; older: data restarted
                    self._inputs.pop(next(iter(self._inputs)))
            return h

    def hidden_backward(self, key: int, grad_h: np.ndarray) -> None:
        """Update this worker's units with their part of ``d loss / d h``."""
        with self._busy():
            X, acts = self._inputs.pop(key)
            self._units().backward(X, acts, grad_h)

    def _units(self) -> HiddenLayers:
        """This worker's slice of the hidden layer (only a holder of units is asked)."""
        if self.hidden is None:
            raise RuntimeError(f"shard {self.shard.shard_index} holds no hidden units")
        return self.hidden

    def backward(self, lse: np.ndarray) -> Packed:
        with self._busy():
            grad_h = self.shard.backward(lse)
            if self._mirror is not None:
                self._mirror.after_step(self.shard)
            return pack(grad_h, self.wire_dtype)

    def topk(self, h: Packed, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        with self._busy():
            return self.shard.topk(unpack(h), k, exact)

    def remember(self) -> None:
        with self._busy():
            self.shard.remember()
            if self.hidden is not None:
                self.hidden.remember()

    def recall(self) -> bool:
        with self._busy():
            return self.shard.recall() and (self.hidden is None or self.hidden.recall())

    def close(self) -> None:
        """Drop this shard's arrays now (again: nothing), before the actor is released
        (:meth:`.Coordinator.close` says when that is)."""
        if self._feed is not None:
            self._feed.stop()
        self._feed = self._mirror = None
        self._inputs.clear()
        self.hidden = None
        vars(self).pop("shard", None)

    def info(self) -> dict:
        shard = self.shard
        return {
            "shard": shard.shard_index,
            "neurons": shard.n_local,
            "steps": shard.step,
            "rebuilds": shard.schedule.n_rebuilds,
            "busy_seconds": self.busy_seconds,
            "calls": self.calls,
            **shard.occupancy(),
        }

    @contextmanager
    def _busy(self):
        """Count this call's compute time; numba gets this worker's threads. A shard that
        was being streamed to is trained or queried from now on: its feed is done."""
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        numba.set_num_threads(self.n_threads)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.busy_seconds += time.perf_counter() - t0
            self.calls += 1

    def write_checkpoint(
        self, folder_url: str, storage_options: dict | None
    ) -> tuple[dict[str, dict], dict[str, Any]]:
        """Write this shard's rows into a checkpoint folder: ``(entries, counters)``."""
        with self._busy():
            folder = Folder.open(folder_url, storage_options)
            entries, shard_counters = write_shard(folder, self.shard)
            counters: dict[str, Any] = shard_counters  # the hidden units join the counts
            if self.hidden is not None:
                entries.update(write_hidden(folder, self.hidden, self.shard.shard_index))
                assert self.hidden.columns is not None, "a shard holds a slice of units"
                counters["hidden_units"] = list(self.hidden.columns)
                counters["hidden_step"] = self.hidden.step
            return entries, counters

    def get_weights(self) -> tuple[np.ndarray, np.ndarray]:
        """This shard's weights and biases (for tests and checkpoints, never per step)."""
        return self.shard.W, self.shard.bias

    def hidden_weights(self) -> list[np.ndarray] | None:
        """The weights and biases of this worker's hidden units (tests only)."""
        return None if self.hidden is None else self.hidden.params()


class InProcess:
    """A shard's methods called in-process through ``run(method, *args)``, which returns
    a coroutine, like an actor call (the coordinator's calls to shard 0)."""

    def __init__(self, target, run) -> None:
        self._target = target
        self._run = run

    def __getattr__(self, name: str):
        method = getattr(self._target, name)
        return lambda *args: self._run(method, *args)

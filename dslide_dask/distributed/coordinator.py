"""The coordinator actor: drives training steps from a worker, holding shard 0 itself.

It owns the (small) hidden layers, shard 0 of the wide layer and the batch stream; its
kernels and shard 0's run on one thread (:data:`~.shard_calls.KERNEL_THREAD`). Per step
it sends the hidden activations to every shard and gets back softmax partial sums and
gradients. Shard calls go worker-to-worker, all shards at once; nothing per step passes
through the client or the scheduler. With ``pipeline=True`` (the default) the shards
finish step t and start step t+1 while this worker does the hidden layers' work, so no
worker waits on another's arithmetic (the hidden activations of t+1 then come from
weights one update old).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import numba
from distributed import get_worker

from dslide_dask.checkpoint import CheckpointStore, open_checkpoint
from dslide_dask.checkpoint.model import model_meta, restore_hidden, write_hidden
from dslide_dask.data.batches import plan, shape
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.shuffle import ReadStats
from dslide_dask.data.stream import Stream
from dslide_dask.distributed.graph_step import TakesGraphSteps
from dslide_dask.distributed.hidden_stack import LocalHidden, SplitHidden
from dslide_dask.distributed.live_metrics.events import publish
from dslide_dask.distributed.moves.handover import (
    CoordinatorState,
    RowsPiece,
    UnitsPiece,
    take_units,
)
from dslide_dask.distributed.moves.mirroring import MirrorsRows
from dslide_dask.distributed.queries import AnswersQueries
from dslide_dask.distributed.shard_actor import InProcess, ShardActor
from dslide_dask.distributed.shard_calls import CallsShards, on_kernel_thread, weakly
from dslide_dask.distributed.specs import CoordinatorSpec
from dslide_dask.distributed.turns import TicketBook
from dslide_dask.distributed.worker_process import prepare_worker_process
from dslide_dask.metrics import TrainingLabels
from dslide_dask.model.hidden import HiddenLayers
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.network import check_finite, step_stats
from dslide_dask.model.optimizer import scheduled_lr
from dslide_dask.model.wide_shard import combine_partials
from dslide_dask.model.wire import pack, payload_bytes, sum_unpacked


class Coordinator(TakesGraphSteps, AnswersQueries, MirrorsRows, CallsShards):
    """Runs the training loop of one model whose shards are other actors."""

    def __init__(
        self,
        spec: CoordinatorSpec,
        state: CoordinatorState | None = None,
        pieces: dict[int, RowsPiece] | None = None,
        units: list[UnitsPiece] | None = None,
    ) -> None:
        """``state``, ``pieces`` (shard 0's rows), ``units`` (the hidden stack's, or shard
        0's slice's): a live model handed over (:mod:`.handover`)."""
        prepare_worker_process()
        self.cfg = spec.cfg
        self.n_threads = spec.n_threads
        numba.set_num_threads(spec.n_threads)
        fresh = spec.restore is None and state is None
        self.hidden: HiddenLayers | None = None  # here, unless split over the shards
        if not spec.hidden_units:
            self.hidden = HiddenLayers(self.cfg, spec.n_features, self.cfg.seed, fresh)
            self.stack: LocalHidden | SplitHidden = LocalHidden(self.hidden, weakly(self._compute))
        self.hidden_units = spec.hidden_units
        self._keys = itertools.count()  # names a training step's hidden forward
        self.layout = spec.layout
        self.step = 0
        self.last_checkpoint: str | None = None
        if spec.restore is not None:
            ckpt = open_checkpoint(spec.restore, spec.storage_options)
            if self.hidden is not None:
                restore_hidden(ckpt, self.hidden, moments=not spec.answering)
            self.step, self.last_checkpoint = ckpt.step, ckpt.url
        self.labels = TrainingLabels(spec.n_labels)  # PSP@k's label frequencies
        if state is not None:
            self.settle(spec.layout, state)
            if self.hidden is not None:
                take_units(self.hidden, units or [])
        self.policy = spec.checkpoint
        self.store = spec.checkpoint.store() if spec.checkpoint is not None else None
        self.last_save = time.monotonic()
        self.n_features = spec.n_features
        self.n_labels = spec.n_labels
        self.worker = get_worker()
        # shard 0 lives here: its calls need no serialisation and no loop-back connection
        self.local_shard = ShardActor(
            spec.local_shard, pieces, None if self.hidden is not None else units
        )
        self.shards: list = [InProcess(self.local_shard, on_kernel_thread)]
        self.remote, self.n_remote = [False], 0
        self.tickets = TicketBook(1)
        self.shard_workers = list(spec.shard_workers)
        self.wire_dtype = spec.wire_dtype
        self.pipeline = spec.pipeline
        self.batches: Iterator[tuple[int, int, XCDataset]] = iter(())
        self.planned = None  # the data source the batches come from
        self.stream = Stream(batch_size=1)  # how batches are drawn
        self.position = (0, 0)  # (epoch, batch) of the next batch to train
        self.reads = ReadStats()
        #: pipelined: the step whose forward pass the shards have done
        self.pending: tuple[list[int], XCDataset, Any, list] | None = None
        self.compute_seconds = 0.0  # this worker's hidden-layer arithmetic
        self.wait_seconds = 0.0  # waiting for the shards (overlapping waits once)
        self._waiting = (0, 0.0)  # waits under way, and since when
        self.shard_seconds = [0.0] * len(self.shard_workers)  # each shard's answers, in all
        self.run_name = spec.run_name  # on the dashboard
        self.take_graph_steps(spec)

    def settle(self, old: ShardLayout, piece: CoordinatorState | dict | list) -> None:
        """One piece of the old coordinator's parts again, as it is now: its counters,
        shard 0's rows or the hidden units (:func:`~.handover.settle`)."""
        if isinstance(piece, CoordinatorState):
            self.step, self.last_checkpoint = piece.step, piece.last_checkpoint
            self.labels = piece.labels
            if piece.data is not None:
                self._use_data(*piece.data)
        elif isinstance(piece, list) and self.hidden is not None:
            take_units(self.hidden, piece, adopt=True)
        else:
            self.local_shard.settle(old, piece)

    def connect(self, shards: list) -> None:
        """The actors of the other shards (1, 2, ...), in shard order."""
        if len(shards) != len(self.shard_workers) - 1:
            raise ValueError(f"{len(shards)} shard actors for {len(self.shard_workers)} shards")
        self.shards = [self.shards[0], *shards]
        self.remote, self.n_remote = [False] + [True] * len(shards), len(shards)
        self.tickets = TicketBook(len(self.shards))
        if self.hidden_units:
            holders = self.shards[: len(self.hidden_units)]
            self.stack = SplitHidden(holders, self.hidden_units, weakly(self._all))

    # -- data --------------------------------------------------------------------------------
    async def set_data(
        self, source: XCDataset | str, stream: Stream, storage_options: dict | None = None
    ) -> None:
        """Train next on the batches ``stream`` draws from ``source`` (a data set, or a URL
        that this worker streams straight from storage)."""
        planned = await asyncio.to_thread(plan, source, storage_options)
        if shape(planned) != (self.n_features, self.n_labels):
            raise ValueError(
                f"data has {planned.n_features} features and {planned.n_labels} labels, "
                f"the model {self.n_features} and {self.n_labels}"
            )
        self._use_data(planned, stream)

    def _use_data(self, planned, stream: Stream) -> None:
        self.reads = ReadStats()
        self.labels.n_points = planned.n_points
        self.planned, self.stream, self.pending = planned, stream, None
        self.position = (stream.first_epoch, stream.first_batch)
        self.batches = stream.batches(planned, self.reads)

    async def close(self) -> None:
        """Drop the model's arrays on every worker now (the trainer's ``close``, and a
        live move's old model), not when its actors are released: the client lets go of
        an actor only once its own collector has broken the reference cycles that
        distributed's actor handles sit in, and a move releases the old actors lazily."""
        try:
            await self._all([s.close() for s in self.shards], "close")
        finally:
            self.local_shard.close()  # also if a remote shard failed
            self.hidden = self.pending = self.planned = None
            self.batches = iter(())
            self.shards = [self.shards[0]]
            vars(self).pop("stack", None)

    def data_left(self) -> tuple | None:
        """The planned data source and the rest of the stream, for a successor."""
        if self.planned is None:
            return None
        return self.planned, self.stream.from_position(*self.position)

    # -- training ----------------------------------------------------------------------------
    async def run(self, n_steps: int) -> list[dict]:
        """Take up to ``n_steps`` steps (fewer when the data runs out); their statistics."""
        out = []
        step = self._pipelined_step if self.pipeline else self._step
        for _ in range(n_steps):
            stats = await (self._graph_step() if self.step_mode == "graph" else step())
            if stats is None:
                break
            if (
                self.policy is not None
                and self.store is not None  # the policy's
                and self.policy.due(self.step, time.monotonic() - self.last_save)
            ):
                stats["checkpoint"] = await self.save_checkpoint(self.store)
            out.append(stats)
            self._publish({k: v for k, v in stats.items() if k != "checkpoint"})
        return out

    def _publish(self, record: dict) -> None:
        """Live metrics for the dashboard: one message to the scheduler, no round trip."""
        publish(self.worker, {**record, "shard_busy": self.shard_seconds}, self.run_name)

    async def _step(self) -> dict | None:
        item = next(self.batches, None)
        if item is None:
            return None
        t0 = time.perf_counter()
        *where, batch = item
        h, acts = await self.stack.forward(batch.X, next(self._keys))
        h_wire = pack(h, self.wire_dtype)
        parts = await self._all([s.forward(h_wire, batch.Y) for s in self.shards], "forward")
        lse, label_term = combine_partials(parts)
        grads = await self._all([s.backward(lse) for s in self.shards], "backward")
        await self.stack.backward(batch.X, acts, sum_unpacked(grads))
        sent = self.n_remote * (payload_bytes((h_wire, batch.Y)) + lse.nbytes)
        received = self._remote_bytes(parts) + self._remote_bytes(grads)
        return self._stats(
            batch, where, parts, lse=lse, label_term=label_term, sent=sent, received=received, t0=t0
        )

    async def _pipelined_step(self) -> dict | None:
        """Finish step t while step t+1 starts, keeping every shard busy.

        Each shard gets ``backward(t)`` at once and ``forward(t+1)`` as soon as this worker
        has the activations of t+1, without waiting for the first answer: the calls take
        turns (:mod:`.turns`), so a remote shard starts the forward the moment it has
        finished the backward. This worker computes the activations of t+1 first, then
        applies the hidden layers' update of t while the shards work. The activations of
        t+1 therefore come from hidden weights one update old; two updates old learns
        worse early on, so the pipeline goes no deeper.
        """
        t0 = time.perf_counter()
        sent = 0
        if self.pending is None:
            item = next(self.batches, None)
            if item is None:
                return None
            *where, batch = item
            h, acts = await self.stack.forward(batch.X, next(self._keys))
            h_wire = pack(h, self.wire_dtype)
            parts = await self._all([s.forward(h_wire, batch.Y) for s in self.shards], "forward")
            sent += self.n_remote * payload_bytes((h_wire, batch.Y))
            self.pending = (where, batch, acts, parts)
        where, batch, acts, parts = self.pending
        lse, label_term = combine_partials(parts)
        item = next(self.batches, None)
        if item is not None:  # first in this worker's queue: the remote shards never wait
            *next_where, following = item
            ahead = asyncio.ensure_future(self._forward_packed(following.X))
        backward = [
            asyncio.ensure_future(self._in_turn(i, "backward", lse))
            for i in range(len(self.shards))
        ]
        sent += self.n_remote * lse.nbytes
        if item is not None:

            async def forward_after(i: int):
                if not self.remote[i]:
                    await backward[i]  # this worker's shard: queued behind its backward
                h_wire, _ = await ahead
                return await self._in_turn(i, "forward", h_wire, following.Y)

            forward = [asyncio.ensure_future(forward_after(i)) for i in range(len(self.shards))]
        try:
            grads = await self._all(backward, "backward")
            if item is not None:  # t+1's activations come from the weights before t's update
                await ahead
            await self.stack.backward(batch.X, acts, sum_unpacked(grads))
            received = self._remote_bytes(grads)
            self.pending = None
            if item is not None:
                next_parts = await self._all(forward, "forward")
                h_wire, next_acts = ahead.result()
                sent += self.n_remote * payload_bytes((h_wire, following.Y))
                received += self._remote_bytes(next_parts)
                self.pending = (next_where, following, next_acts, next_parts)
        except BaseException:
            self.tickets.abandon()  # calls numbered but never sent must not hold up others
            raise
        finally:
            if item is not None:
                for task in (ahead, *forward):
                    task.cancel()
        return self._stats(
            batch, where, parts, lse=lse, label_term=label_term, sent=sent, received=received, t0=t0
        )

    async def _forward_packed(self, X: CSR):
        """The hidden stack's output for training batch ``X``, packed for the wire, and its
        activations."""
        h, acts = await self.stack.forward(X, next(self._keys))
        return pack(h, self.wire_dtype), acts

    def _remote_bytes(self, replies: list) -> int:
        """Bytes of the replies that crossed the network (not from this worker's shard)."""
        return sum(
            payload_bytes(r) for r, remote in zip(replies, self.remote, strict=True) if remote
        )

    def _stats(self, batch, where, parts, *, lse, label_term, sent, received, t0) -> dict:
        self.step += 1
        hidden_sent, hidden_received = self.stack.take_traffic()
        sent, received = sent + hidden_sent, received + hidden_received
        self.labels.add(batch.Y)
        epoch, index = where
        self.position = (epoch, index + 1)
        compute, wait = self.compute_seconds, self.wait_seconds
        self.compute_seconds = self.wait_seconds = 0.0
        stats = step_stats(lse, label_term, parts, batch.Y)
        check_finite(stats.loss, self.step, self.last_checkpoint)
        return {
            "step": self.step,
            "samples": batch.n_points,
            "loss": stats.loss,
            "active": stats.active_per_example,
            "lr": scheduled_lr(self.cfg, self.step),
            "bytes_sent": int(sent),
            "bytes_received": int(received),
            "seconds": time.perf_counter() - t0,
            "coordinator_seconds": compute,
            "shard_wait_seconds": wait,
            "skipped_lines": self.reads.n_skipped,
        }

    # -- early stopping ----------------------------------------------------------------------
    async def remember(self) -> None:
        """Every shard and the hidden layers keep a copy of their weights, where they are."""
        await self._all([s.remember() for s in self.shards], "remember")
        await self.stack.remember()

    async def recall(self) -> bool:
        """Put back the weights :meth:`remember` kept; False if none were."""
        recalled = await self._all([s.recall() for s in self.shards], "recall")
        return all([*recalled, await self.stack.recall()])

    # -- checkpoints -------------------------------------------------------------------------
    async def save_checkpoint(
        self, store: CheckpointStore, extra: dict | None = None, commit: bool = True
    ) -> str | tuple[str, dict]:
        """Write the whole model into ``store``: each shard writes its own rows straight
        to storage (no weights pass through here), then this worker the hidden layers and
        the metadata, committing the checkpoint. Its URL; with ``commit`` False, the
        folder's URL and the metadata to commit it with once more parts are in it."""
        folder = await asyncio.to_thread(store.new_folder, self.step)
        calls = [s.write_checkpoint(folder.url, store.storage_options) for s in self.shards]
        shards = await self._all(calls, "checkpoint")
        hidden, step = {}, 0  # a split layer's units: written by their shards
        if self.hidden is not None:
            hidden, step = await self._compute(write_hidden, folder, self.hidden), self.hidden.step
        meta = model_meta(
            self.cfg,
            self.n_features,
            self.n_labels,
            self.layout,
            step,
            shards,
            hidden,
            {**self.stream.meta(*self.position), **(extra or {})},
        )
        if not commit:
            return folder.url, meta
        ckpt = await asyncio.to_thread(store.commit, folder, meta)
        self.last_checkpoint = ckpt.url
        self.last_save = time.monotonic()
        return ckpt.url

    async def save(
        self, url: str, storage_options: dict | None, extra: dict | None
    ) -> str | tuple[str, dict]:
        """Write the model into a new folder of ``url`` (a store keeping only one
        checkpoint), uncommitted: the caller adds its parts and commits (see
        :meth:`save_checkpoint`)."""
        store = CheckpointStore(url, storage_options, keep=1)
        return await self.save_checkpoint(store, extra, commit=False)

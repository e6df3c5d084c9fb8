"""Graph step mode: each training step as a small graph of Dask tasks named by phase.

The actor step mode is faster (a step is a few worker-to-worker calls, nothing through
the scheduler), but the dashboard's task stream, the performance report and fine
performance metrics then see nothing of a step. In graph mode the coordinator submits
every step as tasks pinned to the workers that hold the model's parts:

    hidden-forward ──> hash[s] ──> gather[s] ──> softmax ──> scatter[s] ──> hidden-update
     (coordinator)       (every shard s)       (coordinator)  (every shard)   (coordinator)

``hash`` finds each example's active neurons in shard s's tables, ``gather`` computes the
logits of their rows, ``softmax`` combines the shards' partial sums into the normaliser,
``scatter`` updates the active rows and returns the shard's gradient. The arithmetic is
the actor mode's, call for call (same weights for the same seed); only who calls differs.
Tasks find the parts in :mod:`~dslide_dask.distributed.registry` and carry the same bytes
between workers as the actor calls do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed import Client, Future, get_client

from dslide_dask.data.dataset import XCDataset
from dslide_dask.distributed.errors import POLL_SECONDS
from dslide_dask.distributed.registry import COORDINATOR, KERNEL_LOCK, lookup, register
from dslide_dask.distributed.specs import CoordinatorSpec
from dslide_dask.model.wide_shard import combine_partials
from dslide_dask.model.wire import pack, payload_bytes, sum_unpacked

if TYPE_CHECKING:
    from dslide_dask.model.hidden import HiddenLayers

#: The phases of a step, as its tasks' key prefixes (the task stream's colours).
PHASES = ("hidden-forward", "hash", "gather", "softmax", "scatter", "hidden-update")


def _hidden_forward(model_id: str, step: int):
    with KERNEL_LOCK:
        return lookup(model_id, COORDINATOR).graph_forward(step)


def _hash(model_id: str, shard: int, forward):
    with KERNEL_LOCK:
        return lookup(model_id, shard).hash(*forward)


def _gather(model_id: str, shard: int, active_sets):
    with KERNEL_LOCK:
        return lookup(model_id, shard).gather(active_sets)


def _softmax(model_id: str, step: int, *partials):
    with KERNEL_LOCK:
        return lookup(model_id, COORDINATOR).graph_softmax(step, list(partials))


def _scatter(model_id: str, shard: int, lse):
    with KERNEL_LOCK:
        return lookup(model_id, shard).backward(lse)


def _hidden_update(model_id: str, step: int, *grads) -> None:
    with KERNEL_LOCK:
        lookup(model_id, COORDINATOR).graph_update(step, list(grads))


def submit_step(client: Client, model_id: str, step: int, workers: Sequence[str]) -> list:
    """Submit training step ``step`` of a model whose shard s lives on ``workers[s]``
    (shard 0 and the coordinator on ``workers[0]``); its futures, the last one the step's
    end. Keys are ``(phase-model_id, step[, shard])``."""

    def task(phase: str, fn, where: str, *args, shard: int | None = None) -> Future:
        name = f"{phase}-{model_id}"
        key = (name, step) if shard is None else (name, step, shard)
        return client.submit(
            fn, *args, key=key, workers=[where], allow_other_workers=False, pure=False
        )

    shards = list(enumerate(workers))
    forward = task("hidden-forward", _hidden_forward, workers[0], model_id, step)
    hashed = [task("hash", _hash, w, model_id, s, forward, shard=s) for s, w in shards]
    parts = [task("gather", _gather, w, model_id, s, hashed[s], shard=s) for s, w in shards]
    lse = task("softmax", _softmax, workers[0], model_id, step, *parts)
    grads = [task("scatter", _scatter, w, model_id, s, lse, shard=s) for s, w in shards]
    done = task("hidden-update", _hidden_update, workers[0], model_id, step, *grads)
    return [forward, *hashed, *parts, lse, *grads, done]


@dataclass
class _GraphStep:
    """What a graph-mode step's tasks leave on the coordinator for its statistics."""

    batch: XCDataset
    acts: list | None = None
    parts: list | None = None
    lse: np.ndarray | None = None
    label_term: np.ndarray | None = None
    sent: int = 0
    received: int = 0


class TakesGraphSteps:
    """The coordinator's side of graph mode: submit a step's tasks and answer the three
    that run on its worker. Mixed into :class:`~.coordinator.Coordinator`, whose hidden
    layers, counters and statistics it uses, as declared below."""

    # set by the host, the coordinator
    batches: Iterator[tuple[int, int, XCDataset]]
    step: int
    shard_workers: list[str]
    hidden: HiddenLayers | None  #: whole here in graph mode
    wire_dtype: str
    n_remote: int  #: shards on other workers
    wait_seconds: float

    if TYPE_CHECKING:

        def _stats(self, batch, where, parts, *, lse, label_term, sent, received, t0) -> dict: ...
        def _timed(self, fn: Any, *args: Any) -> Any: ...
        def _remote_bytes(self, replies: list) -> int: ...
        async def _check_alive(self, what: str) -> None: ...

    def take_graph_steps(self, spec: CoordinatorSpec) -> None:
        """Set up from the coordinator's spec: the step mode, and this process's registry
        entry that graph-mode tasks find the coordinator by."""
        self.step_mode = spec.step_mode
        self.model_id = spec.model_id
        self.graph: _GraphStep | None = None  # the step the tasks are taking
        register(spec.model_id, COORDINATOR, self)

    async def _graph_step(self) -> dict | None:
        """One step as tasks through the scheduler (see the module); the tasks call
        back :meth:`graph_forward`, :meth:`graph_softmax` and :meth:`graph_update`."""
        item = next(self.batches, None)
        if item is None:
            return None
        t0 = time.perf_counter()
        *where, batch = item
        self.graph = _GraphStep(batch)
        client = get_client()
        await client  # started (a no-op once it is)
        futures = submit_step(client, self.model_id, self.step + 1, self.shard_workers)
        try:
            await self._await_task(futures[-1], "the graph")
        finally:
            del futures
        graph, self.graph = self.graph, None
        return self._stats(
            batch,
            where,
            graph.parts,
            lse=graph.lse,
            label_term=graph.label_term,
            sent=graph.sent,
            received=graph.received,
            t0=t0,
        )

    def graph_forward(self, step: int):
        """Task ``hidden-forward``: the hidden stack's output for the step's batch, packed
        for the wire, with the batch's labels (what every shard's ``hash`` needs)."""
        graph = self._graph_at(step)
        h, graph.acts = self._timed(self._whole_stack().forward, graph.batch.X)
        h_wire = pack(h, self.wire_dtype)
        graph.sent += self.n_remote * payload_bytes((h_wire, graph.batch.Y))
        return h_wire, graph.batch.Y

    def graph_softmax(self, step: int, parts: list) -> np.ndarray:
        """Task ``softmax``: the normaliser of every example from the shards' partials."""
        graph = self._graph_at(step)
        graph.parts = parts
        graph.lse, graph.label_term = combine_partials(parts)
        graph.sent += self.n_remote * graph.lse.nbytes
        graph.received += self._remote_bytes(parts)
        return graph.lse

    def graph_update(self, step: int, grads: list) -> None:
        """Task ``hidden-update``: the hidden layers' update from the shards' gradients."""
        graph = self._graph_at(step)
        graph.received += self._remote_bytes(grads)
        self._timed(self._whole_stack().backward, graph.batch.X, graph.acts, sum_unpacked(grads))

    def _whole_stack(self) -> HiddenLayers:
        """The hidden layers, whole on this worker (graph mode never splits them)."""
        if self.hidden is None:
            raise RuntimeError("graph steps need the whole hidden stack on the coordinator")
        return self.hidden

    def _graph_at(self, step: int) -> _GraphStep:
        if self.graph is None or step != self.step + 1:
            raise RuntimeError(f"a task of step {step} ran, the coordinator is at {self.step}")
        return self.graph

    async def _await_task(self, future, what: str):
        """A task's result; fail fast if a shard's worker is gone (its pinned tasks would
        wait for it for ever)."""

        async def result():
            return await future

        task = asyncio.ensure_future(result())
        t0 = time.perf_counter()
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=POLL_SECONDS)
                if done:
                    return task.result()
                await self._check_alive(what)
        finally:
            self.wait_seconds += time.perf_counter() - t0
            task.cancel()

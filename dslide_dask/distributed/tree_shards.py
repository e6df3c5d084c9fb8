"""A cluster's label trees, trained and kept in pieces on its workers, never gathered.

The trees' node classifiers are handed out over the model's workers in batches, costliest
first (:func:`~dslide_dask.model.tree_nodes.cost_batches`), a batch to each worker as it
finishes its last, so an error in the cost estimate leaves no worker waiting long
(Debian-26K on 2 workers: 6.8-7.5 s of nodes dealt all at once, against 5.9 s half of one
worker's time); each worker's :class:`TreeShard` actor trains its nodes and keeps them, as
a partial tree once the builder knows the trees' shapes
(:mod:`~dslide_dask.model.tree_shards`). A query's path losses are each piece's share,
added up (:class:`ShardTrees`); a save writes each piece from its worker. So the trees'
weights (3.9 GB of ``amazon-3m``'s 300K rows) are spread as the output layer is, and
what crosses the network is a query's rows and candidates and their losses.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.distributed.fused_worker import worker_threads
from dslide_dask.model.label_tree import LabelTree
from dslide_dask.model.tree_nodes import NodeProblem, cost_batches, train_levels
from dslide_dask.model.tree_shards import (
    KeptNodes,
    inner_losses,
    leaf_losses,
    rounds_topk_losses,
    summed_losses,
    weightless,
)


class TreeShard:
    """Actor: the node classifiers of the label trees this worker trained."""

    def __init__(self) -> None:
        self.kept = KeptNodes.empty()
        self.trees: tuple[LabelTree, ...] = ()
        self.nodes: tuple[np.ndarray, ...] = ()  # each tree's nodes weighed here
        self.problem: tuple[NodeProblem, int, int] | None = None  # the tree being trained

    def begin(self, problem: NodeProblem, seed: int, tree: int) -> None:
        """Hold what tree ``tree``'s nodes are trained on until :meth:`end`."""
        self.problem = (problem, seed, tree)

    def train(self, jobs: list[tuple[np.ndarray, int]]) -> None:
        """Train the nodes ``jobs`` (children, node) of the tree begun and keep them."""
        if self.problem is None:
            raise RuntimeError("no tree begun on this shard")
        problem, seed, tree = self.problem
        worker_threads()
        parts = train_levels(problem, [jobs], seed)[0]
        self.kept.keep(tree, [node for _, node in jobs], parts)

    def end(self) -> None:
        self.problem = None

    def assemble(self, shapes: tuple[LabelTree, ...]) -> int:
        """The kept nodes as partial trees of ``shapes`` (the trees as the builder has
        them, weightless); the bytes of weights held here."""
        self.nodes = tuple(np.array(sorted(self.kept.parts.get(t, {})), np.int64)
                           for t in range(len(shapes)))  # fmt: skip
        self.trees = tuple(self.kept.partial(t, shape) for t, shape in enumerate(shapes))
        return self._weight_bytes()

    def inner(self, X: CSR, ids: np.ndarray) -> np.ndarray:
        """This piece's share of the mean losses above the leaves of candidates ``ids``
        of rows ``X``."""
        worker_threads()
        return inner_losses(self.trees, X, ids)

    def leaves(self, X: CSR, ids: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        """This piece's share of the mean leaf losses of the candidates ``chosen``."""
        worker_threads()
        return leaf_losses(self.trees, X, ids, chosen)

    def load(self, url: str, pieces: list[int], storage_options: dict | None) -> int:
        """Keep the ``pieces`` of the trees saved at ``url`` (a checkpoint folder); the
        bytes of weights held here."""
        from dslide_dask.checkpoint.neighbours import load_tree_pieces

        self.trees, self.nodes = load_tree_pieces(url, pieces, storage_options)
        return self._weight_bytes()

    def _weight_bytes(self) -> int:
        return sum(t.w_feature.nbytes + t.w_val.nbytes for t in self.trees)

    def save(self, folder_url: str, piece: int, storage_options: dict | None) -> dict:
        """Write this piece (piece 0: the trees' shapes too) into the checkpoint folder;
        the manifest's entries of what was written."""
        from dslide_dask.checkpoint.tree_pieces import save_tree_piece

        return save_tree_piece(folder_url, self.trees, self.nodes, piece, storage_options)


class ShardNodes:
    """Trains a tree's node classifiers on the :class:`TreeShard` actors ``shards`` (a
    :data:`~dslide_dask.model.tree_nodes.NodeTrainer`; the trees in order, as
    ``build_forest`` trains them when given one), which keep them: what it returns is
    weightless, the trees' shapes."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards
        self.tree = 0

    def __call__(
        self, problem: NodeProblem, levels: list[list[tuple[np.ndarray, int]]], seed: int
    ) -> list[list[tuple]]:
        jobs = [job for level in levels for job in level]
        batches = deque(cost_batches([problem.cost(c) for c, _ in jobs], len(self.shards)))
        for call in [shard.begin(problem, seed, self.tree) for shard in self.shards]:
            call.result()
        lock = threading.Lock()

        def feed(shard: Any) -> None:  # a batch at a time, as the shard asks
            while True:
                with lock:
                    if not batches:
                        return
                    batch = batches.popleft()
                shard.train([jobs[j] for j in batch]).result()

        try:
            with ThreadPoolExecutor(len(self.shards)) as pool:
                list(pool.map(feed, self.shards))
        finally:
            for call in [shard.end() for shard in self.shards]:
                call.result()
        self.tree += 1
        return [[weightless(len(children) - 1) for children, _ in level] for level in levels]


class ShardTrees:
    """The label trees of a cluster's fused model as re-ranking asks them
    (:class:`~dslide_dask.model.tree_shards.TreeLosses`): each piece asked at once, for
    the losses above the leaves and then twice for leaves
    (:func:`~dslide_dask.model.tree_shards.rounds_topk_losses`)."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards

    def topk_losses(
        self, X: CSR, ids: np.ndarray, scores: np.ndarray, *, power: float, k: int
    ) -> np.ndarray:
        inner = summed_losses([call.result() for call in [s.inner(X, ids) for s in self.shards]])

        def leaves(chosen: np.ndarray) -> np.ndarray:
            calls = [shard.leaves(X, ids, chosen) for shard in self.shards]
            return np.asarray(np.sum([c.result() for c in calls], axis=0, dtype=np.float32))

        return rounds_topk_losses(inner, leaves, ids, scores, power, k)


def start_shards(client: Any, workers: list[str]) -> list[Any]:
    """A :class:`TreeShard` actor on each of ``workers`` (their futures: the client keeps
    them, and the pieces, until it lets them go)."""
    token = uuid.uuid4().hex[:8]
    return [
        client.submit(
            TreeShard,
            actor=True,
            workers=[w],
            allow_other_workers=False,
            key=f"tree-shard-{s}-{token}",
        )  # fmt: skip
        for s, w in enumerate(workers)
    ]

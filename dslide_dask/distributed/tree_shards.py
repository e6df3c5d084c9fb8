"""A cluster's label trees, trained and kept in pieces on its workers, never gathered.

The trees' node classifiers are dealt out over the model's workers by their cost
(:meth:`~dslide_dask.model.tree_nodes.NodeProblem.cost`), longest first, each to the
least loaded; each worker's :class:`TreeShard` actor trains its nodes and keeps them, as
a partial tree once the builder knows the trees' shapes
(:mod:`~dslide_dask.model.tree_shards`). A query's path losses are each piece's share,
added up (:class:`ShardTrees`); a save writes each piece from its worker. So the trees'
weights (3.9 GB of ``amazon-3m``'s 300K rows) are spread as the output layer is, and
what crosses the network is a query's rows and candidates and their losses.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.distributed.fused_worker import worker_threads
from dslide_dask.model.label_tree import LabelTree
from dslide_dask.model.tree_nodes import NodeProblem, train_levels
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

    def train(
        self, problem: NodeProblem, jobs: list[tuple[np.ndarray, int]], seed: int, tree: int
    ) -> None:
        """Train the nodes ``jobs`` (children, node) of tree ``tree`` and keep them."""
        worker_threads()
        parts = train_levels(problem, [jobs], seed)[0]
        self.kept.keep(tree, [node for _, node in jobs], parts)

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
        cost = [problem.cost(children) for children, _ in jobs]
        shares: list[list[tuple[np.ndarray, int]]] = [[] for _ in self.shards]
        load = [0.0] * len(self.shards)
        for j in np.argsort(-np.asarray(cost), kind="stable"):
            least = int(np.argmin(load))
            shares[least].append(jobs[j])
            load[least] += cost[j]
        calls = [
            shard.train(problem, share, seed, self.tree)
            for shard, share in zip(self.shards, shares, strict=True)
            if share
        ]
        for call in calls:
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

"""Training a label tree's node classifiers, wherever they run.

A :class:`~dslide_dask.model.label_tree.LabelTree` is split in one place (the 2-means over
its labels' centroids), then every node's classifiers are trained, each node on its own
rows only: :class:`NodeProblem` is what they read, :func:`train_levels` trains them on
this process's threads, and a cluster's :data:`NodeTrainer` deals them out over its
workers, which keep them (:mod:`dslide_dask.distributed.tree_shards`). A node's
classifiers are the same wherever and on however many threads they are trained.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.kernels import label_tree as kernels
from dslide_dask.malloc import trim_heap

#: Weights copied between two returns of freed heap pages while a tree is joined (256 MB).
TRIM_ENTRIES = 32 << 20
#: The classifiers' C, passes and pruning: the label classifiers' (docs/accuracy.md).
C, PASSES, PRUNE = 1.0, 6, 0.1
#: Batches of nodes handed out per worker (:func:`cost_batches`): the last to finish
#: waits for at most about one of them.
BATCHES_PER_WORKER = 8


@dataclass(frozen=True, eq=False)
class NodeProblem:
    """What a node's classifiers are trained on: the unit rows (CSR), their squared
    norms, each label's rows and the labels in tree order."""

    ptr: np.ndarray
    idx: np.ndarray
    val: np.ndarray
    sq_norms: np.ndarray
    label_ptr: np.ndarray
    label_rows: np.ndarray
    perm: np.ndarray
    n_features: int

    def arrays(
        self,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (self.ptr, self.idx, self.val, self.sq_norms, self.label_ptr,
                self.label_rows, self.perm)  # fmt: skip

    def cost(self, children: np.ndarray) -> float:
        """A node's training time, roughly: the non-zeros of its rows (those of a label
        under it) to the power 1.1, times its children to the power 0.4 (fitted on
        Debian-26K's 261 nodes on one thread: within 20% of their seconds, where its
        (row, label) pairs times its children were within 75%)."""
        lo, hi = int(children[0]), int(children[-1])
        labels = self.perm[lo:hi]
        spans = zip(self.label_ptr[labels], self.label_ptr[labels + 1], strict=True)
        rows = np.unique(np.concatenate([self.label_rows[a:b] for a, b in spans]))
        nnz = float((self.ptr[rows + 1] - self.ptr[rows]).sum())
        return nnz**1.1 * (len(children) - 1) ** 0.4


#: Trains the nodes of a tree's classifier levels: ``(problem, levels of jobs (children,
#: node), seed) -> levels of results``, in order (:func:`train_levels` here; a cluster's
#: spreads them over its workers).
NodeTrainer = Callable[[NodeProblem, list[list[tuple[np.ndarray, int]]], int], list[list[tuple]]]


def cost_batches(cost: list[float], n_workers: int) -> list[list[int]]:
    """The jobs of ``cost`` (their :meth:`NodeProblem.cost`) in batches to hand out to
    ``n_workers`` as each asks for more, costliest first: a job alone once it costs
    ``1 / BATCHES_PER_WORKER`` of a worker's share, the smaller ones gathered up to
    that, so a handful of round trips balance the workers whatever the cost's error."""
    order = np.argsort(-np.asarray(cost, np.float64), kind="stable")
    grain = sum(cost) / (BATCHES_PER_WORKER * max(1, n_workers))
    batches: list[list[int]] = []
    batch: list[int] = []
    held = 0.0
    for j in order:
        batch.append(int(j))
        held += cost[j]
        if held >= grain:
            batches.append(batch)
            batch, held = [], 0.0
    return batches + ([batch] if batch else [])


def train_levels(
    problem: NodeProblem, levels: list[list[tuple[np.ndarray, int]]], seed: int
) -> list[list[tuple]]:
    """Every node's classifiers, trained here on numba's threads, level by level."""
    threads = numba.get_num_threads()
    n_rows = len(problem.ptr) - 1
    scratch = [
        (np.full(n_rows, -1, np.int64), np.full(problem.n_features, -1, np.int64))
        for _ in range(threads)
    ]
    arrays = problem.arrays()

    def train(children: np.ndarray, node: int, worker: int, blocks: int) -> tuple:
        return kernels.train_node(
            *arrays, children, PASSES, C, PRUNE, seed + node, blocks, *scratch[worker]
        )

    return [_trained(jobs, train, threads) for jobs in levels]


def _trained(jobs: list[tuple[np.ndarray, int]], train, threads: int) -> list[tuple]:
    """Each job's ``train(children, node, worker, blocks)``, in order. Many nodes: a
    node a thread at once (small nodes waste a parallel pass's start-up); few: one at a
    time over all threads. A node's result does not depend on which."""
    if threads < 2 or len(jobs) < 2 * threads:
        return [train(children, node, 0, threads) for children, node in jobs]

    def work(worker: int) -> list[tuple]:
        return [train(children, node, worker, 1) for children, node in jobs[worker::threads]]

    with ThreadPoolExecutor(threads) as pool:
        shares = list(pool.map(work, range(threads)))
    out: list[tuple] = [None] * len(jobs)  # type: ignore[list-item]
    for worker, share in enumerate(shares):
        out[worker::threads] = share
    return out


def joined(parts: list) -> tuple[np.ndarray, ...]:
    """The nodes' trained classifiers as one set of arrays (a
    :class:`~dslide_dask.model.label_tree.LabelTree`'s last five). Each node's part is
    copied into place and let go (``parts[n] = None``), its heap pages returned every
    :data:`TRIM_ENTRIES`: the tree is never held twice (3.9 GB of weights at
    ``amazon-3m``'s 300K rows)."""
    child_ptr = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p[3]) for p in parts], out=child_ptr[1:])
    entries = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([p[0][-1] for p in parts], out=entries[1:])
    w_ptr = np.zeros(child_ptr[-1] + 1, np.int64)
    w_feature = np.empty(entries[-1], np.int32)
    w_val = np.empty(entries[-1], np.float32)
    bias = np.empty(child_ptr[-1], np.float32)
    copied = 0
    for n, (ptr, feature, val, b) in enumerate(parts):
        a, z = child_ptr[n], child_ptr[n + 1]
        w_ptr[a + 1 : z + 1] = ptr[1:] + entries[n]
        w_feature[entries[n] : entries[n + 1]] = feature
        w_val[entries[n] : entries[n + 1]] = val
        bias[a:z] = b
        parts[n] = None
        copied += len(feature)
        if copied > TRIM_ENTRIES:  # the parts' freed heap pages back to the OS as we go
            trim_heap()
            copied = 0
    return child_ptr, w_ptr, w_feature, w_val, bias

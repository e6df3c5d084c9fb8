"""The fused parts of a model trained on a cluster, built on a worker from storage.

The training rows never come to the client: a task on a worker reads them straight from
storage (or takes the blocks kept on the cluster), splits off the rows held out of the
network's training exactly as the coordinator's stream did (:class:`~dslide_dask.data.
held.HeldRows`), and runs the fit's :class:`~dslide_dask.model.fused_build.FusedRecipe`,
asking the coordinator actor for the network's candidates and hidden vectors. The
:class:`~dslide_dask.model.fused.FusedModel` stays in that worker's memory behind a Dask
future (:class:`RemoteFused`): queries, scores and the save run there too, and only
answers, scores and a few numbers travel. Before training, :func:`row_stats` sums the
labels and non-zeros over the partitions, on the workers, for the recipe's choice of
random negatives and the bytes the fused parts will take.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.checkpoint.fused import load_fused, save_fused
from dslide_dask.checkpoint.store import open_checkpoint
from dslide_dask.data.blocks import block_csr, stack_datasets
from dslide_dask.data.csr import CSR, SCORE_ROWS, row_ranges
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import read_split
from dslide_dask.data.partitions import DataSource, Partition
from dslide_dask.data.source import read_partition
from dslide_dask.distributed.cluster_data import ClusterData
from dslide_dask.distributed.fused_worker import idle_threads, on_threads, watched
from dslide_dask.distributed.tree_shards import ShardNodes, ShardTrees, start_shards
from dslide_dask.metrics import add_sums, metrics_of_sums
from dslide_dask.model.fused import FusedModel
from dslide_dask.model.fused_build import FusedBuild, Report, Stages
from dslide_dask.model.fused_size import RowStats, block_counts, summed
from dslide_dask.model.network_answers import metrics_with_network
from dslide_dask.model.tree_shards import TreeLosses


class CoordinatorNetwork:
    """The network of a model on a cluster as fusion asks it, from a task: its
    coordinator actor answers (``Network`` of :mod:`dslide_dask.model.fused`)."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        parts = [
            self.coordinator.topk(X.slice_rows(a, b), k, exact, scores=True).result()
            for a, b in row_ranges(X.n_rows, SCORE_ROWS, at_least_one=True)
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def embed(self, X: CSR) -> np.ndarray:
        parts = [
            self.coordinator.embed(X.slice_rows(a, b)).result()
            for a, b in row_ranges(X.n_rows, SCORE_ROWS, at_least_one=True)
        ]
        return np.concatenate(parts).astype(np.float32, copy=False)


@on_threads
def build_fused(
    build: FusedBuild,
    coordinator: Any,
    *source: XCDataset | DataSource,
    shape: tuple[int, int] | None = None,
    tree_shards: tuple[Any, ...] = (),
    topic: str | None = None,
) -> FusedModel:
    """Task: the fused model of the rows of ``source`` (a planned source, read here; or
    the blocks of a data set, stacked in order), the held ones split off as the stream
    did; the label trees' classifiers trained and kept by the :class:`~dslide_dask.
    distributed.tree_shards.TreeShard` actors ``tree_shards`` (none: here, in the model);
    each stage done logged as an event of ``topic`` (None: not), which a client follows;
    on the ``threads`` given (:func:`~.fused_worker.on_threads`)."""
    from distributed import get_worker

    report = None
    if topic is not None:
        worker = get_worker()
        report = functools.partial(worker.log_event, topic)
    stage = Stages(report)
    rows = source[0] if shape is None else stack_datasets(source, *shape)  # type: ignore[arg-type]
    train, held = read_split(rows, build.held, build.skip_bad_lines)
    stage(f"read {train.n_points + (0 if held is None else held.n_points):,} rows")
    nodes = ShardNodes(list(tree_shards)) if tree_shards else None
    fused = build.recipe.build(train, held, CoordinatorNetwork(coordinator), nodes, report)
    if nodes is None or not fused.index.trees:
        return fused
    # the pieces take the trees' shapes; here the trees are weightless, so they go
    stage = Stages(report)
    calls = [shard.assemble(fused.index.trees) for shard in tree_shards]
    kept = ", ".join(f"{call.result() / 2**30:.2f}" for call in calls)
    stage(f"label trees kept in {len(tree_shards)} pieces ({kept} GiB of weights)")
    return dataclasses.replace(fused, index=fused.index.with_trees(()))


@dataclass
class RemoteFused:
    """A fused model held by a worker (``future``), answered there with the network of
    ``coordinator``."""

    client: Any
    future: Any
    coordinator: Any
    worker: str  #: where the model is (its tasks are pinned there: it never moves)
    #: The label trees' pieces (:class:`~dslide_dask.distributed.tree_shards.TreeShard`
    #: actors' futures; none: the trees are in the model, or there are none).
    shards: tuple[Any, ...] = ()
    shard_workers: tuple[str, ...] = ()  #: where they are
    threads: int | None = None  #: numba's threads for its tasks (None: its worker's)

    @classmethod
    def build(
        cls,
        client: Any,
        trainer: Any,
        source: XCDataset | DataSource,
        build: FusedBuild,
        *,
        report: Report | None = None,
    ) -> RemoteFused:
        """Build on a worker of ``trainer``'s model (not the coordinator's, where there
        is another: it streams the batches and holds the hidden layers); ``report`` is
        told each stage done there, as it is (through the worker's events)."""
        workers = list(trainer.placement.workers)
        where, args, shape = workers[-1], (source,), None
        if isinstance(source, ClusterData):  # blocks on the cluster: stacked there
            args, shape = source.parts, (source.n_features, source.n_labels)
        elif isinstance(source, XCDataset):  # rows in the client's memory: sent once
            args = tuple(client.scatter([source], workers=[where]))
        topic = None
        if report is not None:
            topic = f"dslide-fused-build-{uuid.uuid4().hex[:8]}"
            client.subscribe_topic(topic, lambda event: report(str(event[1])))
        threads = idle_threads(client, workers, where)
        spread = len(workers) > 1 and build.recipe.label_tree > 0
        shards = start_shards(client, workers) if spread else []
        future = client.submit(
            build_fused,
            build,
            trainer.coordinator,
            *args,
            shape=shape,
            tree_shards=tuple(shard.result() for shard in shards),
            topic=topic,
            threads=threads,
            pure=False,
            workers=[where],
            key=f"build-fused-{uuid.uuid4().hex}",
        )
        try:
            what = "building the neighbours, centroids and trees"
            watched(client, future, tuple(workers), what, fetch=False)
        except BaseException:
            for shard in shards:
                shard.release()
            raise
        finally:
            if topic is not None:
                client.unsubscribe_topic(topic)
        shards_at = tuple(workers) if shards else ()
        return cls(client, future, trainer.coordinator, where, tuple(shards), shards_at, threads)

    @classmethod
    def load(
        cls, client: Any, trainer: Any, url: str, storage_options: dict | None = None
    ) -> RemoteFused:
        """The fused parts of the checkpoint at ``url``, read by a worker of ``trainer``'s
        model (as :meth:`build` places them) and kept there; label trees saved in pieces
        are loaded in pieces, dealt over the model's workers."""
        from dslide_dask.checkpoint.neighbours import tree_pieces

        workers = list(trainer.placement.workers)
        where = workers[-1]
        n_pieces = tree_pieces(url, storage_options) if len(workers) > 1 else 0
        shards = start_shards(client, workers) if n_pieces else []
        future = client.submit(
            _load, url, storage_options, not shards, pure=False, workers=[where],
            key=f"load-fused-{uuid.uuid4().hex}",
        )  # fmt: skip
        try:
            actors = [shard.result() for shard in shards]
            calls = [
                actor.load(url, list(range(s, n_pieces, len(actors))), storage_options)
                for s, actor in enumerate(actors)
            ]
            for call in calls:
                call.result()
            watched(client, future, (where,), f"loading the fused parts of {url}", fetch=False)
        except BaseException:
            for shard in shards:
                shard.release()
            raise
        threads = idle_threads(client, workers, where)
        shards_at = tuple(workers) if shards else ()
        return cls(client, future, trainer.coordinator, where, tuple(shards), shards_at, threads)

    def _run(self, fn, *args, **kwargs) -> Any:
        future = self.client.submit(
            fn, self.future, self.coordinator, *args, **kwargs, trees=self._trees(),
            threads=self.threads, pure=False, workers=[self.worker],
        )  # fmt: skip
        return self._watched(future)

    def _trees(self) -> tuple[Any, ...]:
        """The trees' pieces' actors, which a task on the model's worker asks."""
        return tuple(shard.result() for shard in self.shards)

    def _watched(self, future: Any) -> Any:
        workers = tuple(dict.fromkeys((self.worker, *self.shard_workers)))
        return watched(self.client, future, workers, "the neighbours, centroids and trees")

    def topk(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` best labels by the whole model, and their scores."""
        return self._run(_topk, X, k=k, exact=exact)

    def metrics(self, data: XCDataset, ks: tuple[int, ...] = (1, 3, 5), exact: bool = True):
        """P@k, nDCG@k and PSP@k of the whole model on ``data`` (and, with exact
        answers, the network's own P@k: ``network P@k``)."""
        return self._run(_metrics, data, ks=ks, exact=exact)

    def topk_array(self, rows, k: int, exact: bool = True):
        """Top-k label ids of a dask array of rows (columns in one chunk) by the whole
        model, as a dask array: each block answered on the model's worker (the block
        travels there, the model never moves)."""
        import dask

        with dask.annotate(workers=[self.worker], allow_other_workers=False):
            return rows.map_blocks(
                _block_topk,
                self.future,
                self.coordinator,
                k=k,
                exact=exact,
                n_cols=int(rows.shape[1]),
                trees=self._trees(),
                threads=self.threads,
                dtype=np.int64,
                chunks=(rows.chunks[0], (k,)),
                name=f"fused-topk-{uuid.uuid4().hex}",
                meta=np.empty((0, 0), np.int64),
            )

    def block_metrics(self, data: ClusterData, ks: tuple[int, ...], exact: bool = True):
        """:meth:`metrics` of a data set whose blocks are on the cluster: each block
        scored by a task of its own on the model's worker (blocks travel there, never
        stacked into one), their sums added here."""
        shape = (data.n_features, data.n_labels)
        futures = [
            self.client.submit(
                _block_sums, self.future, self.coordinator, part, shape=shape, ks=ks,
                exact=exact, trees=self._trees(), threads=self.threads, pure=False,
                workers=[self.worker],
            )
            for part in data.parts
        ]  # fmt: skip
        return metrics_of_sums(add_sums(self._watched(future) for future in futures))

    def parts(self, storage_options: dict | None = None):
        """A parts writer for the trainer's ``save``: the worker writes the fused parts
        into the checkpoint folder before it is committed."""

        def write(folder_url: str, meta: dict) -> dict:
            writes = [t.save(folder_url, p, storage_options) for p, t in enumerate(self._trees())]
            pieces = {name: entry for w in writes for name, entry in w.result().items()}
            return self._watched(self.client.submit(
                _save, self.future, folder_url, storage_options, pieces, pure=False,
                workers=[self.worker],
            ))  # fmt: skip

        return write

    def metric_args(self) -> dict:
        """PSP@k's label counts (a number a label, brought here once)."""
        return self._run(_metric_args)

    def chosen(self) -> tuple[tuple[float, ...], float]:
        """The fusion weights and tail exponent the fit chose (a few numbers)."""
        return self._run(_chosen)

    def model(self) -> FusedModel | None:
        return None  # on its worker: never gathered

    def close(self) -> None:
        self.future.release()
        for shard in self.shards:
            shard.release()


def _losses(trees: tuple[Any, ...]) -> TreeLosses | None:
    return ShardTrees(list(trees)) if trees else None


@on_threads
def _block_topk(block, fused: FusedModel, coordinator, *, k, exact, n_cols, trees):
    X = block_csr(block, n_cols)
    return fused.topk(CoordinatorNetwork(coordinator), X, k, exact, _losses(trees))[0]


@on_threads
def _block_sums(fused: FusedModel, coordinator, block, *, shape, ks, exact, trees) -> dict:
    data = stack_datasets([block], *shape)  # as wide as the whole set's widest block
    net = CoordinatorNetwork(coordinator)
    return fused.metric_sums(net, data.X, data.Y, tuple(ks), exact, _losses(trees))


def _load(url: str, storage_options: dict | None, trees: bool) -> FusedModel:
    fused = load_fused(open_checkpoint(url, storage_options), storage_options, trees)
    if fused is None:
        raise CheckpointError(f"{url}: the model has no fused parts")
    return fused


@on_threads
def _chosen(fused: FusedModel, coordinator, trees) -> tuple[tuple[float, ...], float]:
    return fused.weight, fused.fusion.tail


@on_threads
def _metric_args(fused: FusedModel, coordinator, trees) -> dict:
    return fused.metric_args()


@on_threads
def _topk(fused: FusedModel, coordinator, X: CSR, *, k: int, exact: bool, trees):
    return fused.topk(CoordinatorNetwork(coordinator), X, k, exact, _losses(trees))


@on_threads
def _metrics(fused: FusedModel, coordinator, data: XCDataset, *, ks, exact, trees) -> dict:
    net = CoordinatorNetwork(coordinator)
    return metrics_with_network(fused, net, data.X, data.Y, tuple(ks), exact, _losses(trees))


def _save(fused: FusedModel, folder_url: str, storage_options, pieces: dict) -> dict:
    return save_fused(folder_url, fused, storage_options, pieces)


def row_stats(
    client: Any, source: XCDataset | DataSource, skip_bad_lines: bool = False
) -> tuple[np.ndarray, RowStats]:
    """How many training rows carry each label, and the rows' :class:`RowStats` (what
    the fused parts will take), counted on the workers: partitions are read where they
    are; only a few vectors a partition and their sums travel."""
    if isinstance(source, XCDataset):
        counts, sums, n_points, nnz = block_counts(source)
    else:
        if isinstance(source, ClusterData):
            futures = client.map(block_counts, source.parts, n_labels=source.n_labels, pure=False)
        else:
            futures = client.map(_part_counted, source.partitions, skip=skip_bad_lines, pure=False)
        counts, sums, n_points, nnz = client.submit(summed, futures, pure=False).result()
    return counts, RowStats.of_counts(source.n_features, counts, sums, int(n_points), int(nnz))


def _part_counted(part: Partition, skip: bool) -> tuple:
    return block_counts(read_partition(part, skip)[0])

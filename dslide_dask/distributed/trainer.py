"""Client-side handle of a model trained on a Dask cluster."""

from __future__ import annotations

import gc
import uuid

import numpy as np
from distributed import Client

from dslide_dask.checkpoint import CheckpointPolicy, CheckpointStore, open_checkpoint
from dslide_dask.checkpoint.model import PartsWriter, check_shape
from dslide_dask.checkpoint.store import Folder
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.stream import Stream
from dslide_dask.distributed import live_metrics
from dslide_dask.distributed.cluster_data import ClusterData, on_coordinator, topk_array
from dslide_dask.distributed.errors import (
    POLL_SECONDS,
    quiet_calls_of_released_actors,
)
from dslide_dask.distributed.launch import LaunchesModels
from dslide_dask.distributed.liveness import LOST_AFTER_SECONDS, Liveness
from dslide_dask.distributed.moves.policy import (
    STEPS_PER_CALL,
    ElasticPolicy,
    KeepShardWorkers,
    Move,
    last_event,
)
from dslide_dask.distributed.moves.rebalance import FollowsTheCluster
from dslide_dask.distributed.recovery import Recovery, SurvivesLostWorkers
from dslide_dask.errors import ShardLostError
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.fused_size import NO_FUSED, FusedBytes
from dslide_dask.trainer import StepCallback, refuse_answering


class DistributedTrainer(FollowsTheCluster, SurvivesLostWorkers, LaunchesModels):
    """A :class:`~dslide_dask.trainer.Trainer` whose output layer is sharded over Dask
    workers.

    Each shard is an actor pinned to its worker (never migrated), except shard 0, which
    the coordinator actor holds on its worker beside the hidden layers; the coordinator
    runs the steps. The client only starts things and collects per-step statistics.

    ``checkpoint`` has the model written as the policy says (every shard straight to
    storage). Then a worker lost mid-run is survived: the model is placed again on the
    workers there are (waiting up to ``replace_wait`` seconds for a replacement), restored
    from the latest checkpoint and trained on from its data position; :attr:`recoveries`
    says what was lost and redone. A worker counts as lost only on evidence: the scheduler
    removed it, or its heartbeat stood still for ``lost_after`` seconds (default 60), never
    a slow call (:mod:`.liveness`). ``restore`` starts from a checkpoint URL, of any
    sharding; ``answering``: without its optimiser state, to answer only (it then
    refuses to train or save). Live metrics go to the dashboard (``/dslide``) under ``name``.
    ``step_mode="graph"``: steps as tasks named by phase, for profiling (:mod:`.graph_step`).
    ``hidden_shards``: split a one-layer hidden stack's units over the first workers
    (:mod:`.hidden_stack`); None splits it over every worker only when, whole, it would
    crowd the coordinator's worker (:func:`~.placement.place_shards`).
    ``fused_bytes``: what the fused parts will take on the last worker, where they are
    built after training; placed so that they fit there (:func:`~.placement.place_shards`).
    """

    def __init__(
        self,
        client: Client,
        cfg: SlideConfig,
        n_features: int,
        n_labels: int,
        *,
        n_shards: int | None = None,
        hidden_shards: int | None = None,
        wire_dtype: str = "float16",
        pipeline: bool = True,
        step_mode: str = "actor",
        coordinator_load: float = 0.15,
        checkpoint: CheckpointPolicy | None = None,
        restore: str | None = None,
        storage_options: dict | None = None,
        answering: bool = False,
        max_recoveries: int = 3,
        replace_wait: float = 10.0,
        lost_after: float = LOST_AFTER_SECONDS,
        name: str | None = None,
        elastic: ElasticPolicy | None = ElasticPolicy(),  # noqa: B008 (frozen, shared safely)
        fused_bytes: FusedBytes = NO_FUSED,
    ) -> None:
        super().__init__()  # the state of the parts: moves (FollowsTheCluster)
        self.client = client
        self.cfg = cfg.for_data(n_labels)
        self.n_features = n_features
        self.n_labels = n_labels
        self.n_shards_asked = n_shards
        # graph steps run the hidden stack on the coordinator: split only if asked (an error)
        self.hidden_shards = 1 if hidden_shards is None and step_mode == "graph" else hidden_shards
        self.wire_dtype = wire_dtype
        self.pipeline = pipeline
        self.step_mode = step_mode
        self.coordinator_load = coordinator_load
        self.fused_bytes = fused_bytes
        self.policy = checkpoint
        self.storage_options = storage_options
        self.answering = restore is not None and answering
        self.max_recoveries = max_recoveries
        self.replace_wait = replace_wait
        self.liveness = Liveness(lost_after)
        self.name = name or f"dslide-{uuid.uuid4().hex[:8]}"
        live_metrics.install(client)
        quiet_calls_of_released_actors()
        self.recoveries: list[Recovery] = []
        self.elastic = elastic
        self.moves: list[Move] = []
        if elastic is not None:
            self._events_seen = last_event(client)
            if elastic.leave:
                client.register_plugin(KeepShardWorkers(), name=KeepShardWorkers.name)
        self.history: list[dict] = []
        self.start_step = 0
        self._call_start = 0  #: the step the current training call began at
        if restore is not None:
            ckpt = open_checkpoint(restore, storage_options)
            check_shape(ckpt, n_features, n_labels)
            self.start_step = ckpt.step
        self._futures: list = []
        self._start(restore)

    @property
    def n_shards(self) -> int:
        return len(self.placement.workers)

    @property
    def step(self) -> int:
        """Steps the model has taken (including those before a restore)."""
        return self.start_step + len(self.history)

    def train(
        self,
        data: XCDataset | str | ClusterData,
        stream: Stream,
        callback: StepCallback | None = None,
        storage_options: dict | None = None,
    ) -> list[dict]:
        """Train on the batches ``stream`` draws from ``data``: a data set (sent once to
        the coordinator's worker), blocks on the cluster (:class:`ClusterData`, moved
        there from their workers) or a URL that worker streams straight from storage.
        Returns the new per-step statistics and calls ``callback`` with each."""
        refuse_answering(self.answering, "train")
        start_len = len(self.history)
        self._call_start = self.step
        self._set_data(data, stream, storage_options)
        while True:
            try:
                call = self.coordinator.run(STEPS_PER_CALL)
                self._let_go()  # while the steps run
                chunk = self._wait(call)
            except Exception as err:
                epoch, batch = self._recover(err, start_len, stream)
                self._set_data(data, stream.from_position(epoch, batch), storage_options)
                continue
            for stats in chunk:
                self.history.append(stats)
                if callback is not None:
                    callback(stats)
            done = len(chunk) < STEPS_PER_CALL  # a move under way completes first
            if done and self._prepared is None:
                self._release_old_model()
                self._let_go()
                return self.history[start_len:]
            try:
                n_points = getattr(data, "n_points", None)
                position = self._follow_the_cluster(stream, n_points, finish=done)
            except Exception as err:  # a worker lost during the move
                position = self._recover(err, start_len, stream)
            if position is not None:
                self._set_data(data, stream.from_position(*position), storage_options)
            elif done:
                self._release_old_model()
                self._let_go()
                return self.history[start_len:]

    def _set_data(self, data, stream: Stream, storage_options: dict | None) -> None:
        """The coordinator trains next on ``data`` (blocks on the cluster go to it
        straight from their workers)."""
        if isinstance(data, ClusterData):
            call = ("set_data", {"stream": stream}, data.n_features, data.n_labels)
            self._wait(self._on_coordinator(call, data))
        else:
            self._wait(self.coordinator.set_data(data, stream, storage_options))

    def _on_coordinator(self, call: tuple, data: ClusterData):
        return self.client.submit(
            on_coordinator,
            self.coordinator,
            call,
            *data.parts,
            pure=False,
            workers=[self.placement.workers[0]],
            allow_other_workers=False,
        )

    def save(
        self,
        url: str,
        storage_options: dict | None = None,
        extra: dict | None = None,
        parts: PartsWriter | None = None,
    ) -> str:
        """Write the model to ``url`` (each shard writes its own rows); the checkpoint URL.
        ``extra``: more JSON metadata to keep with it; ``parts``: writes more into the
        folder (from here) before the checkpoint is committed."""
        refuse_answering(self.answering, "save")
        store = CheckpointStore(url, storage_options, keep=1)
        with store.saving():
            folder_url, meta = self._wait(self.coordinator.save(url, storage_options, extra))
            if parts is not None:
                meta.update(parts(folder_url, meta))
            return store.commit(Folder.open(folder_url, storage_options), meta).url

    def topk(self, X: CSR, k: int, exact: bool = True) -> np.ndarray:
        return self._wait(self.coordinator.topk(X, k, exact))

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ids and their logits (see :meth:`LocalTrainer.topk_scores`)."""
        return self._wait(self.coordinator.topk(X, k, exact, scores=True))

    def embed(self, X: CSR) -> np.ndarray:
        """The last hidden layer's output for each row (see :meth:`LocalTrainer.embed`)."""
        return self._wait(self.coordinator.embed(X))

    def topk_array(self, rows, k: int, exact: bool = True):
        """Top-k ids of a dask array of rows (columns in one chunk), as a dask array
        computed where its blocks are."""
        return topk_array(rows, self.coordinator, k, exact)

    def remember(self) -> None:
        """Every worker keeps a copy of its part of the weights (early stopping)."""
        self._wait(self.coordinator.remember())

    def recall(self) -> bool:
        """Put back the weights :meth:`remember` kept; False if none were."""
        return self._wait(self.coordinator.recall())

    def evaluate(
        self,
        data: XCDataset | str | ClusterData,
        ks: tuple[int, ...] = (1, 3, 5),
        exact: bool = True,
        *,
        max_points: int | None = None,
        storage_options: dict | None = None,
    ) -> dict[str, float]:
        """P@k, nDCG@k and (once trained) PSP@k, PSnDCG@k on a data set, blocks on the
        cluster or a URL, computed on the cluster."""
        if isinstance(data, ClusterData):
            kwargs = {"ks": tuple(ks), "exact": exact, "max_points": max_points}
            n_features = max(data.n_features, self.n_features)  # a bag's blocks may be narrower
            call = ("evaluate", kwargs, n_features, max(data.n_labels, self.n_labels))
            return self._wait(self._on_coordinator(call, data))
        return self._wait(
            self.coordinator.evaluate(
                data, storage_options, ks=tuple(ks), exact=exact, max_points=max_points
            )
        )

    def shard_info(self) -> list[dict]:
        return self._wait(self.coordinator.ask_shards("info"))

    def hidden_weights(self) -> list[np.ndarray]:
        return self._wait(self.coordinator.hidden_weights())

    def shard_weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every shard's weights, fetched to the client (tests, small models only)."""
        return self._wait(self.coordinator.ask_shards("get_weights"))

    def close(self) -> None:
        """Free the model on its workers, then release the actors: their futures and the
        handle of the coordinator, which keeps its actor alive too. The arrays go without
        waiting for the workers' garbage collectors, so a next model finds their memory."""
        self._drop_prepared()
        self._release_old_model()
        self._free(self.coordinator)
        futures, self._futures, self.coordinator = self._futures, [], None
        self._release(futures)

    def _release(self, futures: list, now: bool = True) -> None:
        """Let actors go. Actor-call closures hold their handles in reference cycles, which
        keep the actors until collected: now, or (``now=False``) while the next steps run
        (:meth:`_let_go`; a collection holds the client for about 0.1 s)."""
        for future in futures:
            future.release()
        if now:
            gc.collect()
        else:
            self._collect = True

    def __enter__(self) -> DistributedTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait(self, future):
        """The result of a future or actor call, failing fast if a model worker dies."""
        while True:
            try:
                return future.result(timeout=POLL_SECONDS)
            except TimeoutError:
                lost = self._lost()
                if lost:
                    raise ShardLostError(self._lost_message(lost)) from None

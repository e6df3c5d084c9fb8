"""Training in this process: the loop around :class:`SlideNetwork`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dslide_dask.checkpoint import Checkpoint, CheckpointPolicy, CheckpointStore
from dslide_dask.checkpoint.model import PartsWriter, check_shape, load_network, save_network
from dslide_dask.data.batches import Source, load, plan
from dslide_dask.data.csr import CSR, SCORE_ROWS, row_ranges
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.shuffle import ReadStats
from dslide_dask.data.stream import Stream
from dslide_dask.malloc import raise_malloc_thresholds
from dslide_dask.memory import check_memory, model_bytes
from dslide_dask.metrics import TrainingLabels, xc_metrics
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.network import SlideNetwork, check_finite
from dslide_dask.model.optimizer import scheduled_lr
from dslide_dask.omp import passive_wait
from dslide_dask.trainer import StepCallback, refuse_answering


class LocalTrainer:
    """A :class:`~dslide_dask.trainer.Trainer` with every shard in this process.

    ``checkpoint`` writes the model as the policy says; ``restore`` starts from a
    checkpoint (of any sharding) instead of a fresh model, ``answering``: without its
    optimiser state, to answer only (it then refuses to train or save).
    """

    def __init__(
        self,
        cfg: SlideConfig,
        n_features: int,
        n_labels: int,
        n_shards: int = 1,
        checkpoint: CheckpointPolicy | None = None,
        restore: Checkpoint | None = None,
        answering: bool = False,
    ) -> None:
        passive_wait()
        raise_malloc_thresholds()  # a step's temporaries reuse pages (dslide_dask.malloc)
        if restore is None:  # sizes from users' data: checked before a byte is allocated
            check_memory(
                model_bytes(tuple(cfg.hidden), n_features, n_labels),
                f"a model of {n_features:,} features and {n_labels:,} labels (hidden "
                f"{tuple(cfg.hidden)})",
            )
            self.network = SlideNetwork(cfg, n_features, n_labels, n_shards)
        else:
            check_shape(restore, n_features, n_labels)
            self.network = load_network(restore, n_shards, answering=answering)
        self.n_features = n_features
        self.n_labels = n_labels
        self.step = restore.step if restore is not None else 0
        self.policy = checkpoint
        self.store = checkpoint.store() if checkpoint is not None else None
        self.last_checkpoint: Checkpoint | None = restore
        self.history: list[dict] = []
        self.labels = TrainingLabels(n_labels)
        self.answering = restore is not None and answering

    @property
    def recoveries(self) -> list:
        """Nothing to recover from in one process."""
        return []

    @property
    def moves(self) -> list:
        """Nothing to move in one process."""
        return []

    def train(
        self,
        data: Source | str,
        stream: Stream,
        callback: StepCallback | None = None,
        storage_options: dict | None = None,
    ) -> list[dict]:
        """Train on the batches ``stream`` draws from a data set or a URL (streamed);
        returns the new per-step statistics."""
        refuse_answering(self.answering, "train")
        source = plan(data, storage_options)
        self.labels.n_points = source.n_points
        reads = ReadStats()
        new = []
        last_save = time.monotonic()
        for epoch, index, batch in stream.batches(source, reads):
            t0 = time.perf_counter()
            stats = self.network.train_step(batch.X, batch.Y)
            self.labels.add(batch.Y)
            self.step += 1
            check_finite(stats.loss, self.step, _url(self.last_checkpoint))
            record: dict[str, Any] = {
                "step": self.step,
                "samples": batch.n_points,
                "loss": stats.loss,
                "active": stats.active_per_example,
                "lr": scheduled_lr(self.network.cfg, self.step),
                "seconds": time.perf_counter() - t0,
                "skipped_lines": reads.n_skipped,
            }
            if (
                self.policy is not None
                and self.store is not None
                and self.policy.due(self.step, time.monotonic() - last_save)
            ):
                meta = stream.meta(epoch, index + 1)
                self.last_checkpoint = save_network(self.store, self.network, meta)
                record["checkpoint"] = self.last_checkpoint.url
                last_save = time.monotonic()
            new.append(record)
            if callback is not None:
                callback(record)
        self.history.extend(new)
        return new

    def save(
        self,
        url: str,
        storage_options: dict | None = None,
        extra: dict | None = None,
        parts: PartsWriter | None = None,
    ) -> str:
        """Write the model to ``url`` (a checkpoint store keeping only this one), with
        what ``parts`` writes into its folder before the commit; the checkpoint's URL."""
        refuse_answering(self.answering, "save")
        store = CheckpointStore(url, storage_options, keep=1)
        with store.saving():
            return save_network(store, self.network, extra, parts).url

    def remember(self) -> None:
        """Keep a copy of the weights, to :meth:`recall` later (early stopping)."""
        self.network.remember()

    def recall(self) -> bool:
        """Put back the weights :meth:`remember` kept; False if none were."""
        return self.network.recall()

    def embed(self, X: CSR, batch_size: int = SCORE_ROWS) -> np.ndarray:
        """The last hidden layer's output for each row: the space in which the network
        places rows with the same labels close together (what the neighbours compare)."""
        parts = [
            self.network.hidden.forward(X.slice_rows(start, stop))[0]
            for start, stop in row_ranges(X.n_rows, batch_size, at_least_one=True)
        ]
        return np.concatenate(parts).astype(np.float32, copy=False)

    def topk(self, X: CSR, k: int, exact: bool = True) -> np.ndarray:
        return self.topk_scores(X, k, exact)[0]

    def topk_scores(
        self, X: CSR, k: int, exact: bool = True, batch_size: int = SCORE_ROWS
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k label ids and their logits (float32, -inf where none was found), a
        batch of rows at a time."""
        ids = np.empty((X.n_rows, k), np.int64)
        scores = np.empty((X.n_rows, k), np.float32)
        for start, stop in row_ranges(X.n_rows, batch_size):
            ids[start:stop], scores[start:stop] = self.network.topk_scores(
                X.slice_rows(start, stop), k, exact
            )
        return ids, scores

    def evaluate(
        self,
        data: XCDataset | str,
        ks: tuple[int, ...] = (1, 3, 5),
        exact: bool = True,
        *,
        max_points: int | None = None,
        storage_options: dict | None = None,
    ) -> dict[str, float]:
        """P@k, nDCG@k and (once trained) PSP@k, PSnDCG@k on (``max_points`` rows spread
        over) a data set or URL."""
        data = load(data, storage_options, max_points, fits=(self.n_features, self.n_labels))
        return xc_metrics(
            self.topk(data.X, max(ks), exact), data.Y, ks, **self.labels.metric_args()
        )

    def shard_info(self) -> list[dict]:
        """No shards to report on in one process."""
        return []

    def close(self) -> None:
        """Nothing to release in one process."""

    def __enter__(self) -> LocalTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _url(ckpt: Checkpoint | None) -> str | None:
    return None if ckpt is None else ckpt.url

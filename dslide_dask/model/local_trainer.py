"""Training in this process: the loop around :class:`SlideNetwork`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from dslide_dask.data.batches import epoch_batches, load, plan
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.shuffle import ReadStats
from dslide_dask.metrics import precision_at_k
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.network import SlideNetwork


def check_finite(loss: float, step: int) -> None:
    """Stop a run whose loss is no longer a number, saying where."""
    if not math.isfinite(loss):
        raise FloatingPointError(
            f"loss became {loss} at step {step}: the run diverged (try a lower lr)"
        )


class LocalTrainer:
    """The same interface as :class:`~dslide_dask.distributed.DistributedTrainer`, with
    every shard in this process."""

    def __init__(self, cfg: SlideConfig, n_features: int, n_labels: int, n_shards: int = 1) -> None:
        self.network = SlideNetwork(cfg, n_features, n_labels, n_shards)
        self.n_features = n_features
        self.n_labels = n_labels
        self.history: list[dict] = []

    def train(
        self,
        data: XCDataset | str,
        batch_size: int,
        epochs: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        callback: Callable[[dict], None] | None = None,
        first_epoch: int = 0,
        storage_options: dict | None = None,
        skip_bad_lines: bool = False,
    ) -> list[dict]:
        """Train on a data set or a URL (streamed); returns the new per-step statistics."""
        source = plan(data, storage_options)
        reads = ReadStats()
        new = []
        for epoch in range(first_epoch, first_epoch + epochs):
            batches = epoch_batches(
                source, batch_size, epoch, seed, shuffle, skip_bad_lines=skip_bad_lines,
                stats=reads,
            )  # fmt: skip
            for batch in batches:
                t0 = time.perf_counter()
                stats = self.network.train_step(batch.X, batch.Y)
                step = len(self.history) + len(new) + 1
                check_finite(stats.loss, step)
                record = {
                    "step": step,
                    "samples": batch.n_points,
                    "loss": stats.loss,
                    "active": stats.active_per_example,
                    "seconds": time.perf_counter() - t0,
                    "skipped_lines": reads.n_skipped,
                }
                new.append(record)
                if callback is not None:
                    callback(record)
        self.history.extend(new)
        return new

    def topk(self, X: CSR, k: int, exact: bool = True, batch_size: int = 4096) -> np.ndarray:
        out = np.empty((X.n_rows, k), np.int64)
        for start in range(0, X.n_rows, batch_size):
            stop = min(start + batch_size, X.n_rows)
            out[start:stop] = self.network.topk(X.slice_rows(start, stop), k, exact)
        return out

    def evaluate(
        self,
        data: XCDataset | str,
        ks: tuple[int, ...] = (1, 3, 5),
        exact: bool = True,
        max_points: int | None = None,
        storage_options: dict | None = None,
    ) -> dict[str, float]:
        """P@k on (the first ``max_points`` rows of) a data set or URL."""
        data = load(data, storage_options, max_points)
        return precision_at_k(self.topk(data.X, max(ks), exact), data.Y, ks)

    def close(self) -> None:
        """Nothing to release in one process."""

    def __enter__(self) -> LocalTrainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

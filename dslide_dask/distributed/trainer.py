"""Client-side handle of a model trained on a Dask cluster."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np
from distributed import Client

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.distributed.coordinator import Coordinator
from dslide_dask.distributed.errors import ShardLostError
from dslide_dask.distributed.placement import Placement, place_shards
from dslide_dask.distributed.shard_actor import ShardActor
from dslide_dask.model.config import SlideConfig

#: Steps per coordinator call: the client hears about progress this often.
STEPS_PER_CALL = 10
#: Seconds between liveness checks while the client waits.
POLL_SECONDS = 2.0


class DistributedTrainer:
    """A SLIDE network whose output layer is sharded over Dask workers.

    Each shard is an actor pinned to its worker (never migrated); a coordinator actor,
    beside shard 0, holds the hidden layers and runs the steps. The client only starts
    things and collects per-step statistics.
    """

    def __init__(
        self,
        client: Client,
        cfg: SlideConfig,
        n_features: int,
        n_labels: int,
        n_shards: int | None = None,
        wire_dtype: str = "float16",
        pipeline: bool = True,
        coordinator_load: float = 0.1,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.n_features = n_features
        self.n_labels = n_labels
        workers = client.scheduler_info(n_workers=-1)["workers"]
        self.placement: Placement = place_shards(workers, cfg, n_labels, n_shards, coordinator_load)
        token = uuid.uuid4().hex[:8]
        threads = [int(workers[w].get("nthreads", 1)) for w in self.placement.workers]
        self._futures = [
            client.submit(
                ShardActor, cfg.to_dict(), cfg.hidden[-1], self.placement.layout, s, threads[s],
                wire_dtype, actor=True, workers=[w], allow_other_workers=False,
                key=f"wide-shard-{s}-{token}",
            )
            for s, w in enumerate(self.placement.workers)
        ]  # fmt: skip
        self.shards = [self._wait(f) for f in self._futures]
        coordinator = client.submit(
            Coordinator, cfg.to_dict(), n_features, n_labels, self.shards,
            list(self.placement.workers), threads[0], wire_dtype, pipeline,
            actor=True, workers=[self.placement.workers[0]], allow_other_workers=False,
            key=f"coordinator-{token}",
        )  # fmt: skip
        self._futures.append(coordinator)
        self.coordinator = self._wait(coordinator)
        self.history: list[dict] = []

    @property
    def n_shards(self) -> int:
        return len(self.shards)

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
        """Train on ``data``: a data set (sent once to the coordinator's worker) or a URL
        that worker streams straight from storage. Returns the new per-step statistics
        and calls ``callback`` with each."""
        self._wait(
            self.coordinator.set_data(
                data, storage_options, batch_size, epochs, seed, shuffle, first_epoch,
                skip_bad_lines,
            )
        )  # fmt: skip
        new = []
        while True:
            chunk = self._wait(self.coordinator.run(STEPS_PER_CALL))
            for stats in chunk:
                new.append(stats)
                if callback is not None:
                    callback(stats)
            if len(chunk) < STEPS_PER_CALL:
                break
        self.history.extend(new)
        return new

    def topk(self, X: CSR, k: int, exact: bool = True) -> np.ndarray:
        return self._wait(self.coordinator.topk(X, k, exact))

    def evaluate(
        self,
        data: XCDataset | str,
        ks: tuple[int, ...] = (1, 3, 5),
        exact: bool = True,
        max_points: int | None = None,
        storage_options: dict | None = None,
    ) -> dict[str, float]:
        """P@k on a data set or URL, computed on the cluster."""
        return self._wait(
            self.coordinator.evaluate(data, storage_options, tuple(ks), exact, max_points)
        )

    def shard_info(self) -> list[dict]:
        return [self._wait(s.info()) for s in self.shards]

    def hidden_weights(self) -> list[np.ndarray]:
        return self._wait(self.coordinator.hidden_weights())

    def shard_weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every shard's weights, fetched to the client (tests, small models only)."""
        return [self._wait(s.get_weights()) for s in self.shards]

    def close(self) -> None:
        """Release the actors (and the model they hold)."""
        for future in self._futures:
            future.release()
        self._futures = []

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
                self._check_alive()

    def _check_alive(self) -> None:
        alive = set(self.client.scheduler_info(n_workers=-1)["workers"])
        lost = [(s, w) for s, w in enumerate(self.placement.workers) if w not in alive]
        if lost:
            names = ", ".join(f"shard {s} on {w}" for s, w in lost)
            raise ShardLostError(
                f"lost {names} after {len(self.history)} steps: the worker died and its "
                f"part of the model with it"
            )

"""What every trainer offers: the interface the estimator, the CLI and the benches use.

:class:`~dslide_dask.local_trainer.LocalTrainer` (one process) and
:class:`~dslide_dask.distributed.DistributedTrainer` (a Dask cluster) both follow
:class:`Trainer`, so callers never ask which one they hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.stream import Stream

#: Called with each step's statistics.
StepCallback = Callable[[dict], None]


def refuse_answering(answering: bool, what: str) -> None:
    """Refuses to ``what`` a model loaded to answer only, without its optimiser state:
    its zeroed moments would set the wrong step sizes, and would be saved as if real."""
    if answering:
        raise ValueError(
            f"this model was loaded to answer only (answering=True), without its "
            f"optimiser state: load it with answering=False to {what} it"
        )


class Trainer(Protocol):
    """A model being trained, wherever its parts live."""

    n_features: int
    n_labels: int
    history: list[dict]

    @property
    def step(self) -> int:
        """Steps the model has taken (including those before a restore)."""

    @property
    def recoveries(self) -> Sequence[Any]:
        """Lost workers survived during training (none in one process)."""

    @property
    def moves(self) -> Sequence[Any]:
        """Re-balances onto workers that joined or off workers that left (none in one
        process)."""

    def train(
        self,
        data: XCDataset | str,
        stream: Stream,
        callback: StepCallback | None = None,
        storage_options: dict | None = None,
    ) -> list[dict]:
        """Train on the batches ``stream`` draws from ``data`` (a data set or a URL);
        the new per-step statistics, each also passed to ``callback``."""

    def evaluate(
        self,
        data: XCDataset | str,
        ks: tuple[int, ...] = (1, 3, 5),
        exact: bool = True,
        *,
        max_points: int | None = None,
        storage_options: dict | None = None,
    ) -> dict[str, float]:
        """P@k, nDCG@k and (once trained) PSP@k, PSnDCG@k on a data set or URL."""

    def topk(self, X: CSR, k: int, exact: bool = True) -> np.ndarray:
        """Top-k label ids of each row."""

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Top-k label ids of each row and their logits (float32, -inf where none)."""

    def save(
        self,
        url: str,
        storage_options: dict | None = None,
        extra: dict | None = None,
        parts: Callable[[str, dict], dict] | None = None,
    ) -> str:
        """Write the model to ``url``, with what ``parts`` writes into its folder (and
        the metadata it returns) before the commit; the checkpoint URL."""

    def remember(self) -> None:
        """Keep a copy of the weights (early stopping)."""

    def recall(self) -> bool:
        """Put back the weights :meth:`remember` kept; False if none were."""

    def shard_info(self) -> list[dict]:
        """Per-shard statistics of a sharded model (none in one process)."""

    def close(self) -> None:
        """Release what the model holds."""

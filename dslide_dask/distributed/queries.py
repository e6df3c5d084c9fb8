"""What a coordinator answers besides training: top-k labels and evaluation, with the
model where it is (the hidden stack, then every shard, for each block of rows)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from dslide_dask.data.batches import load
from dslide_dask.data.csr import CSR, SCORE_ROWS, row_ranges
from dslide_dask.data.dataset import XCDataset
from dslide_dask.metrics import xc_metrics
from dslide_dask.model.wide_shard import merge_topk_scores
from dslide_dask.model.wire import pack

if TYPE_CHECKING:
    from dslide_dask.distributed.hidden_stack import LocalHidden, SplitHidden
    from dslide_dask.metrics import TrainingLabels


class AnswersQueries:
    """Queries of :class:`~dslide_dask.distributed.coordinator.Coordinator`; what it uses
    of the coordinator is declared below."""

    # set by the host, the coordinator
    stack: LocalHidden | SplitHidden  #: the hidden stack, here or split over the shards
    shards: list  #: every shard's actor (shard 0's called in this process)
    labels: TrainingLabels
    wire_dtype: str
    n_features: int
    n_labels: int
    step: int

    if TYPE_CHECKING:

        async def _all(self, calls: list, what: str) -> list: ...
        def _publish(self, record: dict) -> None: ...

    async def training_labels(self) -> TrainingLabels:
        """The label counts of the rows trained on (saved with the model: PSP@k's)."""
        return self.labels

    async def set_training_labels(self, labels: TrainingLabels) -> None:
        """Take a loaded model's label counts (PSP@k's propensities)."""
        self.labels = labels

    async def evaluate(
        self,
        source: XCDataset | str,
        storage_options: dict | None = None,
        *,
        ks: tuple[int, ...] = (1, 3, 5),
        exact: bool = True,
        max_points: int | None = None,
    ) -> dict[str, float]:
        """P@k, nDCG@k and (once trained) PSP@k, PSnDCG@k on (``max_points`` rows spread
        over) a data set or URL read here."""
        fits = (self.n_features, self.n_labels)
        data = await asyncio.to_thread(load, source, storage_options, max_points, fits)
        topk = await self.topk(data.X, max(ks), exact)
        scores = xc_metrics(topk, data.Y, ks, **self.labels.metric_args())
        if len(data):
            self._publish({"step": self.step, **scores})
        return scores

    async def topk(
        self, X: CSR, k: int, exact: bool, *, scores: bool = False, batch_size: int = SCORE_ROWS
    ):
        """Top-k label ids of each row from every shard; ``scores``: ``(ids, logits)``."""
        ids, logits = [np.zeros((0, k), np.int64)], [np.zeros((0, k), np.float32)]
        for start, stop in row_ranges(X.n_rows, batch_size):
            h, _ = await self.stack.forward(X.slice_rows(start, stop), None)
            h_wire = pack(h, self.wire_dtype)
            parts = await self._all([s.topk(h_wire, k, exact) for s in self.shards], "topk")
            top, top_scores = merge_topk_scores(parts, k)
            ids.append(top)
            logits.append(top_scores)
        top = np.concatenate(ids)
        return (top, np.concatenate(logits)) if scores else top

    async def embed(self, X: CSR, batch_size: int = SCORE_ROWS) -> np.ndarray:
        """The last hidden layer's output for each row (what the neighbours compare)."""
        parts = []
        for start, stop in row_ranges(X.n_rows, batch_size, at_least_one=True):
            h, _ = await self.stack.forward(X.slice_rows(start, stop), None)
            parts.append(np.asarray(h, np.float32))
        return np.concatenate(parts)

    async def hidden_weights(self) -> list[np.ndarray]:
        """The hidden layers' weights and biases (for tests and checkpoints)."""
        return await self.stack.params()

    async def ask_shards(self, method: str) -> list:
        """Every shard's answer to a question (``info``, ``get_weights``), in shard order."""
        return list(await asyncio.gather(*(getattr(s, method)() for s in self.shards)))

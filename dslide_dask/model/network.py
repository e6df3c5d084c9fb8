"""A whole SLIDE network in one process: hidden stack + sharded wide output layer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.hidden import HiddenLayers
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.wide_shard import (
    SoftmaxPartials,
    WideShard,
    combine_partials,
    merge_topk_scores,
)


@dataclass
class StepStats:
    """What one training step did."""

    loss: float
    active_per_example: float


def check_finite(loss: float, step: int, last_checkpoint: str | None = None) -> None:
    """Stop a run whose loss is no longer a number, saying where, and what survives."""
    if not math.isfinite(loss):
        kept = (
            f"; the last good checkpoint is {last_checkpoint}"
            if last_checkpoint
            else "; no checkpoint was written"
        )
        raise FloatingPointError(
            f"loss became {loss} at step {step}: the run diverged (try a lower lr){kept}"
        )


def step_stats(
    lse: np.ndarray, label_term: np.ndarray, parts: list[SoftmaxPartials], Y: CSR
) -> StepStats:
    """Loss (mean over labelled examples) and active neurons per labelled example."""
    labelled = np.diff(Y.indptr) > 0
    loss = float((lse - label_term)[labelled].mean()) if labelled.any() else 0.0
    active = sum(float(p.n_active.sum()) for p in parts) / max(1, int(labelled.sum()))
    return StepStats(loss, active)


class SlideNetwork:
    """A network ``n_features -> hidden layers -> n_labels`` with an LSH-sampled softmax
    output layer.

    The output layer is held as ``n_shards`` :class:`WideShard` objects; in one process
    they run one after another, exactly the arithmetic the distributed trainer spreads
    over workers.
    """

    def __init__(
        self,
        cfg: SlideConfig,
        n_features: int,
        n_labels: int,
        n_shards: int = 1,
        layout: ShardLayout | None = None,
        initialize: bool = True,
    ) -> None:
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        if n_labels < 2:
            raise ValueError(f"n_labels must be >= 2, got {n_labels}")
        self.cfg = cfg = cfg.for_data(n_labels)  # the learning rate, if left to the data
        self.n_features = n_features
        self.n_labels = n_labels
        self.hidden = HiddenLayers(cfg, n_features, cfg.seed, initialize)
        self.layout = layout or ShardLayout.strided(n_labels, n_shards)
        self.shards = [
            WideShard(cfg, cfg.hidden[-1], self.layout, s, initialize)
            for s in range(self.layout.n_shards)
        ]

    def train_step(self, X: CSR, Y: CSR) -> StepStats:
        """One SGD step on a batch (rows of X with their label sets Y)."""
        h, acts = self.hidden.forward(X)
        parts = [shard.forward(h, Y) for shard in self.shards]
        lse, label_term = combine_partials(parts)
        grad_h = self.shards[0].backward(lse)
        for shard in self.shards[1:]:
            grad_h += shard.backward(lse)
        self.hidden.backward(X, acts, grad_h)
        return step_stats(lse, label_term, parts, Y)

    def remember(self) -> None:
        """Keep a copy of every weight, to :meth:`recall` later (early stopping)."""
        self.hidden.remember()
        for shard in self.shards:
            shard.remember()

    def recall(self) -> bool:
        """Put back the weights :meth:`remember` kept; False if none were."""
        return all([self.hidden.recall(), *(shard.recall() for shard in self.shards)])

    def topk(self, X: CSR, k: int, exact: bool = True) -> np.ndarray:
        """Top-k label ids per row (``exact``: over all labels; else LSH-retrieved only)."""
        return self.topk_scores(X, k, exact)[0]

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Top-k label ids per row and their logits (-inf where none was found)."""
        h, _ = self.hidden.forward(X)
        return merge_topk_scores([shard.topk(h, k, exact) for shard in self.shards], k)

"""Random negatives a whole batch shares, scored as one dense matrix product.

Most of what an example computes is random negatives (drawn for each example, 2,400 of
Debian-26K's 2,500 active neurons an example, 1,270 of 1,500 on amazon-670k): gathered
one example at a time, each row costs hundreds of bytes of weights and Adam state for a
few floating-point operations each. Drawn once for the batch, the same rows serve every
example: gathered once, scored with BLAS (``h @ W[S].T``), their gradients summed by
another product, and each row takes one Adam step a batch. Each example's own labels
and retrieved neurons stay per example (:mod:`..kernels.active_sets` leaves the shared
ones out and says which of them each example has as a label or a retrieval).

The normaliser stays unbiased as with per-example negatives: a shared neuron that is
neither a label nor retrieved stands for ``rest / n_random`` neurons of its example,
where ``rest`` is what that example did not find; its logit carries ``log`` of that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dslide_dask.kernels import adam, wide_layer

if TYPE_CHECKING:
    from dslide_dask.model.wide_shard import WideShard


@dataclass
class SharedBlock:
    """A batch's shared neurons and what a step keeps of them between its halves."""

    rows: np.ndarray  #: local ids, ascending
    kind: np.ndarray  #: ``[B, n]`` uint8, SHARED_RANDOM / SHARED_FOUND / SHARED_LABEL
    W: np.ndarray | None = None  #: their weight rows as the forward read them
    logits: np.ndarray | None = None  #: ``[B, n]``, then the logit gradients


def draw_rows(n_local: int, count: int, seed: tuple[int, ...]) -> np.ndarray:
    """``count`` distinct local ids (all if fewer), ascending, from ``seed``."""
    rng = np.random.default_rng(seed)
    count = min(count, n_local)
    return np.sort(rng.choice(n_local, size=count, replace=False)).astype(np.int64)


def forward(
    block: SharedBlock,
    h: np.ndarray,
    W: np.ndarray,
    bias: np.ndarray,
    shift: np.ndarray,
    weight: np.ndarray,
    row_max: np.ndarray,
    row_sumexp: np.ndarray,
    label_part: np.ndarray,
) -> None:
    """Score the shared neurons for every labelled example and fold them into its softmax
    partials (updated in place); the logits are kept on ``block`` for :func:`backward`."""
    block.W = W[block.rows]
    block.logits = h @ block.W.T
    wide_layer.shared_logits(
        block.logits, bias[block.rows], block.kind, shift, weight, row_max, row_sumexp, label_part
    )


def backward(
    block: SharedBlock, h: np.ndarray, lse: np.ndarray, weight: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row gradients [n, H], bias gradients [n], d loss / d h [B, H])`` of the shared
    neurons: ``(softmax - target) * scale`` per entry, then two matrix products."""
    assert block.logits is not None and block.W is not None
    g = block.logits
    wide_layer.shared_gradients(g, lse, block.kind, weight, scale)
    return g.T @ h, g.sum(axis=0), g @ block.W


def adam_step(
    shard: WideShard,
    rows: np.ndarray,
    grads: np.ndarray,
    grad_bias: np.ndarray,
    lr: float,
    salt: int,
) -> None:
    """One Adam step of a shard's (a :class:`~.wide_shard.WideShard`'s) shared rows,
    given their gradients: the step's own, or one replayed by a live move's receiver."""
    cfg = shard.cfg
    adam.adam_given_rows(
        rows,
        grads,
        grad_bias,
        *shard.adam_arrays(),
        lr,
        cfg.beta1,
        cfg.beta2,
        cfg.eps,
        salt,
    )

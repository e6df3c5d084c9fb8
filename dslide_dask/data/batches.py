"""The order in which training batches are taken: one definition for every trainer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dslide_dask.data.dataset import XCDataset


def epoch_order(n_points: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """Row order of an epoch: a permutation drawn from ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(n_points)
    return np.random.default_rng([seed, epoch]).permutation(n_points)


def epoch_batches(
    data: XCDataset, batch_size: int, epoch: int, seed: int, shuffle: bool = True
) -> Iterator[XCDataset]:
    """The batches of one epoch over an in-memory data set."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if shuffle:
        data = data.take(epoch_order(data.n_points, epoch, seed))
    yield from data.batches(batch_size)

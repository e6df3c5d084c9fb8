"""A labelled data set: sparse features X and label sets Y, row-aligned."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dslide_dask.data.csr import CSR


@dataclass(frozen=True, eq=False)
class XCDataset:
    """Extreme-classification data: ``X`` (points x features, float values) and ``Y``
    (points x labels, pattern only)."""

    X: CSR
    Y: CSR

    def __post_init__(self) -> None:
        if self.X.n_rows != self.Y.n_rows:
            raise ValueError(f"X has {self.X.n_rows} rows but Y has {self.Y.n_rows}")

    @property
    def n_points(self) -> int:
        return self.X.n_rows

    @property
    def n_features(self) -> int:
        return self.X.n_cols

    @property
    def n_labels(self) -> int:
        return self.Y.n_cols

    def __len__(self) -> int:
        return self.n_points

    def slice(self, start: int, stop: int) -> XCDataset:
        return XCDataset(self.X.slice_rows(start, stop), self.Y.slice_rows(start, stop))

    def take(self, rows: np.ndarray) -> XCDataset:
        return XCDataset(self.X.take_rows(rows), self.Y.take_rows(rows))

    def shuffled(self, seed: int) -> XCDataset:
        return self.take(np.random.default_rng(seed).permutation(self.n_points))

    def sample(self, n: int | None) -> XCDataset:
        """At most ``n`` rows spread evenly over the set, in their order (None: all).
        Not the first ``n``: XC files are often sorted (by label, by name), and a prefix
        then scores a model on one corner of the data."""
        rows = spread_rows(self.n_points, n)
        return self if rows is None else self.take(rows)

    def batches(self, batch_size: int) -> Iterator[XCDataset]:
        for start in range(0, self.n_points, batch_size):
            yield self.slice(start, start + batch_size)


def spread_rows(n_points: int, n: int | None) -> np.ndarray | None:
    """The rows :meth:`XCDataset.sample` keeps of ``n_points`` (None: every row)."""
    if n is None or n >= n_points:
        return None
    return np.linspace(0, n_points - 1, n).round().astype(np.int64)

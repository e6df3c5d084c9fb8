"""Rows held out of the network's training, drawn from a stream without gathering it.

A fit chooses its fusion weights on rows the network never trained on. In memory it
draws them at random (:func:`~dslide_dask.model.fused_build.held_split`); streamed from
storage, where no process sees every row, each row is held or not by a hash of where it
is (its file, byte range and line there; or its row number in a data set in memory), so
the coordinator streaming batches and the worker building the fused parts agree on every
row without a word between them, epoch after epoch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from dslide_dask.data.blocks import stack_datasets
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.partitions import DataSource, Partition
from dslide_dask.data.source import read_partition


@dataclass(frozen=True)
class HeldRows:
    """Each row is held with probability ``share``, drawn from ``seed`` and where it is."""

    share: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"the held share must be in (0, 1), got {self.share}")

    @classmethod
    def of(cls, n_held: int, n_points: int, seed: int) -> HeldRows | None:
        """About ``n_held`` of ``n_points`` rows (None: none)."""
        if n_held <= 0 or n_points <= 0:
            return None
        return cls(min(n_held / n_points, 0.5), seed)

    def mask(self, n_rows: int, part: Partition | None = None) -> np.ndarray:
        """Which of the ``n_rows`` rows of ``part`` (None: a data set in memory) are held."""
        where = "" if part is None else f"{part.url}|{part.start}|{part.part}"
        rng = np.random.default_rng([self.seed, 0x4E1D, zlib.crc32(where.encode())])
        return rng.random(n_rows) < self.share

    def split(self, data: XCDataset, part: Partition | None = None) -> tuple[XCDataset, XCDataset]:
        """``(rows trained on, rows held)`` of ``data`` (all of ``part``'s rows)."""
        held = self.mask(data.n_points, part)
        return data.take(np.flatnonzero(~held)), data.take(np.flatnonzero(held))

    def training(self, data: XCDataset, part: Partition | None = None) -> XCDataset:
        """The rows of ``data`` the network trains on."""
        return data.take(np.flatnonzero(~self.mask(data.n_points, part)))


def read_split(
    source: XCDataset | DataSource, held: HeldRows | None, skip_bad_lines: bool = False
) -> tuple[XCDataset, XCDataset | None]:
    """Every row of ``source`` read here, as ``(rows trained on, rows held)`` (None:
    nothing held): the same split the stream's batches make."""
    if isinstance(source, XCDataset):
        return (source, None) if held is None else held.split(source)
    train, kept = [], []
    for part in source.partitions:
        data, _ = read_partition(part, skip_bad_lines)
        if held is None:
            train.append(data)
            continue
        rows, out = held.split(data, part)
        train.append(rows)
        kept.append(out)
    shape = source.n_features, source.n_labels
    return stack_datasets(train, *shape), None if held is None else stack_datasets(kept, *shape)

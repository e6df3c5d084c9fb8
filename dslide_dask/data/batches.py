"""Where training batches come from: one definition for every trainer.

A source is an in-memory :class:`XCDataset` or a URL (file, glob, folder, converted
layout) planned into partitions by :func:`~dslide_dask.data.source.open_source` and
streamed with a bounded shuffle buffer by :func:`~dslide_dask.data.shuffle.iter_batches`,
so a worker never holds the whole training set.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import HeldRows
from dslide_dask.data.inputs import check_fits
from dslide_dask.data.partitions import DataSource
from dslide_dask.data.shuffle import ReadStats, iter_batches
from dslide_dask.data.source import open_source, read_dataset

Source = XCDataset | DataSource


def plan(source: Source | str, storage_options: dict | None = None) -> Source:
    """A data set or planned source as is; a URL planned into partitions (headers only)."""
    if isinstance(source, XCDataset | DataSource):
        return source
    return open_source(source, storage_options)


def load(
    source: XCDataset | str,
    storage_options: dict | None = None,
    max_points: int | None = None,
    fits: tuple[int, int] | None = None,
) -> XCDataset:
    """A data set in memory (``max_points`` rows spread over it: :meth:`XCDataset.sample`),
    e.g. for evaluation; with
    ``fits=(n_features, n_labels)`` checked against a model (headers first)."""
    if fits is not None and not isinstance(source, XCDataset):
        check_fits(open_source(source, storage_options), *fits, what=source)
    data = source if isinstance(source, XCDataset) else read_dataset(source, storage_options)[0]
    if fits is not None:
        check_fits(data, *fits, what="the evaluation data")
    return data.sample(max_points)


def shape(source: Source) -> tuple[int, int]:
    """``(n_features, n_labels)``."""
    return source.n_features, source.n_labels


def row_order(n_points: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """Row order of an epoch over an in-memory data set: a permutation from
    ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(n_points)
    return np.random.default_rng([seed, epoch]).permutation(n_points)


def epoch_batches(
    source: Source,
    batch_size: int,
    epoch: int,
    seed: int,
    shuffle: bool = True,
    *,
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
    held: HeldRows | None = None,
) -> Iterator[XCDataset]:
    """The batches of one epoch, less the rows ``held`` out of training. A planned source
    is always shuffled (partitions, then rows within a bounded buffer); an in-memory one
    when ``shuffle``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(source, DataSource):
        yield from iter_batches(
            source.partitions,
            batch_size,
            epoch,
            seed,
            skip_bad_lines=skip_bad_lines,
            stats=stats,
            held=held,
        )
        return
    if held is not None:
        source = held.training(source)
    data = source.take(row_order(source.n_points, epoch, seed)) if shuffle else source
    yield from data.batches(batch_size)

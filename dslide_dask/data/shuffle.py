"""Per-epoch shuffling without the whole data set in one place: shuffle the partitions,
then shuffle rows within a bounded buffer. Deterministic by ``(seed, epoch)``.

:func:`iter_batches` holds at most ``buffer_points + batch_size - 1`` rows between
partitions, plus the partition being merged and the next one being read (prefetched in a
thread while batches are consumed). Each time a partition arrives, the buffered rows and
its rows form a pool; a uniform random sample of the pool, all but ``buffer_points`` rows
(in whole batches), goes out as batches and the rest stays buffered. A larger buffer mixes
partitions more; the buffer should span several partitions for a good shuffle of data
sorted by label, as the Extreme Classification files are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import HeldRows
from dslide_dask.data.partitions import Partition, PointCounter, concat
from dslide_dask.data.seeds import derive_seed
from dslide_dask.data.source import read_partition

BUFFER_POINTS = 65536
_ORDER, _ROWS = 1, 2  # seed tags


@dataclass
class ReadStats:
    """Counts gathered by :func:`iter_batches` (pass one in to see them)."""

    n_partitions: int = 0
    n_points: int = 0
    n_skipped: int = 0  #: bad lines dropped (``skip_bad_lines``)
    max_buffered: int = 0  #: most rows held between partitions

    def summary(self) -> str:
        skipped = f", {self.n_skipped} bad line(s) skipped" if self.n_skipped else ""
        return f"{self.n_points} points from {self.n_partitions} partitions{skipped}"


def epoch_order(partitions: Sequence[Partition], epoch: int, seed: int) -> list[Partition]:
    """The partitions in this epoch's order: a permutation fixed by ``(seed, epoch)``."""
    rng = np.random.default_rng(derive_seed(seed, epoch, _ORDER))
    return [partitions[i] for i in rng.permutation(len(partitions))]


def iter_batches(
    partitions: Sequence[Partition],
    batch_size: int,
    epoch: int,
    seed: int,
    buffer_points: int = BUFFER_POINTS,
    *,
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
    reader: Callable[[Partition, bool], tuple[XCDataset, int]] = read_partition,
    held: HeldRows | None = None,
) -> Iterator[XCDataset]:
    """Shuffled batches of one epoch over ``partitions`` (the last may be smaller).

    The same ``(partitions, batch_size, epoch, seed, buffer_points)`` give the same
    batches. Every point comes exactly once (but those ``held`` out of training). Split
    text files are checked against their headers' N_points as their last byte range
    arrives (:class:`PointCounter`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if buffer_points < 0:
        raise ValueError(f"buffer_points must be >= 0, got {buffer_points}")
    stats = stats if stats is not None else ReadStats()
    if not partitions:
        return
    n_features, n_labels = partitions[0].n_features, partitions[0].n_labels
    rng = np.random.default_rng(derive_seed(seed, epoch, _ROWS))
    counter = PointCounter()
    buffer: XCDataset | None = None
    for part, data, skipped in _prefetched(
        epoch_order(partitions, epoch, seed), reader, skip_bad_lines
    ):
        counter.add(part, len(data) + skipped)
        if held is not None:
            data = held.training(data, part)
        stats.n_partitions += 1
        stats.n_points += len(data)
        stats.n_skipped += skipped
        pool = concat([buffer, data] if buffer is not None else [data], n_features, n_labels)
        n_out = max(0, len(pool) - buffer_points) // batch_size * batch_size
        if n_out:
            rows = rng.permutation(len(pool))
            yield from pool.take(rows[:n_out]).batches(batch_size)
            buffer = pool.take(np.sort(rows[n_out:]))
        else:
            buffer = pool
        stats.max_buffered = max(stats.max_buffered, len(buffer))
    if buffer is not None and len(buffer):
        yield from buffer.take(rng.permutation(len(buffer))).batches(batch_size)


def _prefetched(
    parts: list[Partition], reader: Callable, skip: bool
) -> Iterator[tuple[Partition, XCDataset, int]]:
    """``(part, *reader(part, skip))`` in order, reading the next one in a thread."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="dslide-prefetch")
    try:
        nxt: Future = pool.submit(reader, parts[0], skip)
        for i, part in enumerate(parts):
            data, skipped = nxt.result()
            if i + 1 < len(parts):
                nxt = pool.submit(reader, parts[i + 1], skip)
            yield part, data, skipped
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

"""What every reader of stored data shares: the partition descriptors, a source's plan,
and the checks and joins of what partitions hold.

Planning (:mod:`.source` for text, :mod:`.binary` for the converted layout) and reading
import from here, never from each other.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.xc_text import XCFormatError

TEXT = "text"
NPZ = "npz"
PARTITION_BYTES = 64 << 20  # default byte-range size of a split text file
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Partition:
    """One unit of reading: a byte range of an XC text file, a whole (compressed) text
    file, or one chunk of the converted layout. Picklable; read by :func:`read_partition`.
    """

    url: str  #: the text file, or the chunk file
    format: str  #: ``"text"`` or ``"npz"``
    n_features: int
    n_labels: int
    n_points: int  #: the text file's header N_points / the chunk's points
    start: int = 0  #: text: this partition owns the lines starting in [start, stop)
    stop: int | None = None  #: None: to the end of the (decompressed) file
    size: int | None = None  #: bytes in the stored file
    compression: str | None = None  #: fsspec compression name
    part: int = 0  #: index of this byte range in its file
    n_parts: int = 1  #: byte ranges of the file
    first_line: int | None = None  #: line number at ``start`` (set by index_partitions)
    file_lines: int | None = None  #: lines in the whole file (set by index_partitions)
    storage_options: dict[str, Any] = field(default_factory=dict, compare=False)
    #: bytes a compressed file may decompress to (None: a share of the reader's free memory)
    max_decompressed: int | None = field(default=None, compare=False)

    @property
    def whole_file(self) -> bool:
        return self.n_parts == 1


@dataclass(frozen=True)
class DataSource:
    """A planned data set: its shape and its partitions in storage order."""

    url: str
    format: str
    n_points: int
    n_features: int
    n_labels: int
    partitions: tuple[Partition, ...]


class PointCounter:
    """Checks, as the byte ranges of split files are read, that each file holds its
    header's N_points: :meth:`add` raises once all of a file's ranges are in."""

    def __init__(self) -> None:
        self._seen: dict[str, list[int]] = {}

    def add(self, part: Partition, lines: int) -> None:
        """Record ``lines`` (points read + bad lines skipped) from ``part``."""
        if part.format != TEXT or part.whole_file:
            return  # checked when read
        seen = self._seen.setdefault(part.url, [0, 0])
        seen[0] += 1
        seen[1] += lines
        if seen[0] == part.n_parts:
            check_points(part.url, seen[1], part.n_points)


def check_point_counts(partitions: Sequence[Partition], lines: Sequence[int]) -> None:
    """:class:`PointCounter` over a whole read: ``lines[i]`` from ``partitions[i]``."""
    counter = PointCounter()
    for part, n in zip(partitions, lines, strict=True):
        counter.add(part, n)


def concat(datasets: Sequence[XCDataset], n_features: int, n_labels: int) -> XCDataset:
    """The rows of ``datasets``, one after the other."""
    datasets = [d for d in datasets if len(d)]
    if len(datasets) <= 1:
        return datasets[0] if datasets else empty_dataset(n_features, n_labels)
    return XCDataset(
        _concat_csr([d.X for d in datasets], n_features),
        _concat_csr([d.Y for d in datasets], n_labels),
    )


def _concat_csr(mats: list[CSR], n_cols: int) -> CSR:
    indptr = np.zeros(1 + sum(m.n_rows for m in mats), np.int64)
    row = base = 0
    for m in mats:
        indptr[row + 1 : row + 1 + m.n_rows] = m.indptr[1:] - m.indptr[0] + base
        row += m.n_rows
        base += m.nnz
    indices = np.concatenate([m.indices for m in mats])
    data = None if mats[0].data is None else np.concatenate([m.data for m in mats])
    return CSR(indptr, indices, data, n_cols)


def empty_dataset(n_features: int, n_labels: int) -> XCDataset:
    """A data set with no points."""
    zero = np.zeros(1, np.int64)
    none = np.zeros(0, np.int32)
    return XCDataset(
        CSR(zero, none, np.zeros(0, np.float32), n_features), CSR(zero, none, None, n_labels)
    )


def check_points(url: str, lines: int, n_points: int) -> None:
    if lines < n_points:
        raise XCFormatError(
            url,
            lines + 2,
            f"the file ends after {lines} point(s) but the header says N_points = {n_points}",
        )
    if lines > n_points:
        raise XCFormatError(
            url,
            n_points + 2,
            f"more points than the header's N_points = {n_points} (the file has {lines})",
        )


def route_options(url: str, so: dict) -> dict:
    """Plain options of a chained URL go to its innermost file system (fsspec would give
    them to the outermost, e.g. the cache)."""
    if "::" not in url or not so:
        return dict(so)
    protocols = [fsspec.core.split_protocol(bit)[0] or bit for bit in url.split("::")]
    if any(k in protocols for k in so):
        return dict(so)
    return {protocols[-1]: dict(so)}


def ordered_map(fn: Callable, items: list, n_threads: int | None) -> Iterator:
    """``map(fn, items)`` on a thread pool, in order, at most 2 * threads ahead."""
    n_threads = n_threads or min(os.cpu_count() or 1, 16)
    if n_threads <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(n_threads) as pool:
        pending: deque = deque()
        it = iter(items)
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * n_threads:
                break
        while pending:
            yield pending.popleft().result()
            for item in it:
                pending.append(pool.submit(fn, item))
                break

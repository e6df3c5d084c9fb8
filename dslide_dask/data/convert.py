"""Converting XC text into the chunked layout of :mod:`dslide_dask.data.binary`, which
later epochs read much faster than text."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import fsspec

from dslide_dask.data.binary import CHUNK_POINTS, FORMAT, VERSION, npz_bytes
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.partitions import (
    MANIFEST,
    PARTITION_BYTES,
    PointCounter,
    concat,
    ordered_map,
    route_options,
)
from dslide_dask.data.source import open_source, read_partition
from dslide_dask.errors import DataError
from dslide_dask.paths import guard_write


@dataclass(frozen=True)
class ConvertSummary:
    """What :func:`convert` wrote."""

    url: str  #: the manifest
    n_points: int
    n_chunks: int
    n_skipped: int  #: bad lines dropped (with ``skip_bad_lines``)
    bytes_written: int
    seconds: float


def convert(
    src_url: str,
    dst_url: str,
    chunk_points: int = CHUNK_POINTS,
    storage_options: dict | None = None,
    *,
    skip_bad_lines: bool = False,
    partition_bytes: int = PARTITION_BYTES,
    n_threads: int | None = None,
    dst_storage_options: dict | None = None,
) -> ConvertSummary:
    """Convert XC text at ``src_url`` (file, glob or folder) into the chunked layout in
    the folder ``dst_url``, in equal chunks of at most ``chunk_points`` points. The text
    is fully validated; the manifest is written only when everything was read (a failed
    conversion leaves no manifest).
    """
    if chunk_points < 1:
        raise ValueError(f"chunk_points must be >= 1, got {chunk_points}")
    t0 = time.perf_counter()
    src = open_source(src_url, storage_options, partition_bytes)
    if src.format != "text":
        raise DataError(f"{src_url} is already converted")  # masks the URL's credentials
    # equal chunks (at most ``chunk_points``) balance the workers reading them
    n_chunks = max(1, -(-src.n_points // chunk_points))
    chunk_points = max(1, -(-src.n_points // n_chunks))
    dso = storage_options if dst_storage_options is None else dst_storage_options
    dso = route_options(dst_url, dso or {})
    fs, root = fsspec.core.url_to_fs(dst_url, **dso)
    # no file this writes may be a link out of the folder: all checked before any is written
    out = lambda name: guard_write(fs, root, root.rstrip("/") + "/" + name)  # noqa: E731
    manifest_path = out(MANIFEST)
    for i in range(n_chunks):
        out(chunk_name(i))
    fs.makedirs(root, exist_ok=True)
    if fs.exists(manifest_path):
        fs.rm(manifest_path)
    counter = PointCounter()
    chunks: list[dict] = []
    pending: list[XCDataset] = []
    n_pending = n_skipped = written = 0

    def flush(final: bool) -> None:
        nonlocal pending, n_pending, written
        data = concat(pending, src.n_features, src.n_labels)
        start = 0
        while data.n_points - start >= chunk_points or (final and start < data.n_points):
            piece = data.slice(start, start + chunk_points)
            start += len(piece)
            name = chunk_name(len(chunks))
            blob = npz_bytes(piece)
            fs.pipe_file(out(name), blob)
            written += len(blob)
            chunks.append(
                {
                    "file": name,
                    "n_points": piece.n_points,
                    "nnz": piece.X.nnz,
                    "n_label_ids": piece.Y.nnz,
                    "bytes": len(blob),
                }
            )
        pending = [data.slice(start, data.n_points)]
        n_pending = data.n_points - start

    read = lambda part: (part, *read_partition(part, skip_bad_lines))  # noqa: E731
    for part, data, skipped in ordered_map(read, list(src.partitions), n_threads):
        counter.add(part, len(data) + skipped)
        n_skipped += skipped
        pending.append(data)
        n_pending += len(data)
        if n_pending >= chunk_points:
            flush(final=False)
    flush(final=True)
    n_points = sum(c["n_points"] for c in chunks)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "n_points": n_points,
        "n_features": src.n_features,
        "n_labels": src.n_labels,
        "chunks": chunks,
        "source": src_url,
        "skipped_lines": n_skipped,
    }
    fs.pipe_file(out(MANIFEST), json.dumps(manifest, indent=1).encode())
    seconds = time.perf_counter() - t0
    url = dst_url.rstrip("/") + "/" + MANIFEST
    return ConvertSummary(url, n_points, len(chunks), n_skipped, written, seconds)


def chunk_name(index: int) -> str:
    return f"chunk-{index:06d}.npz"

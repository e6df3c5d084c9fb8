"""Shared helpers of the training-data storage tests (``tests/test_storage_*.py``):
numbered rows (a row's identity in its feature 0) to follow through byte ranges,
shuffles and chunks, and the reading, writing and comparing of datasets in storage."""

from __future__ import annotations

import dataclasses

import fsspec
import numpy as np

from dslide_dask.data import CSR, XCDataset, write_xc
from dslide_dask.data.partitions import DataSource, check_point_counts, concat
from dslide_dask.data.source import index_partitions, read_partition


def numbered(n: int, seed: int = 0, n_features: int = 300, n_labels: int = 50) -> XCDataset:
    """Random rows whose feature 0 holds the row number + 1 (a row's identity)."""
    rng = np.random.default_rng(seed)
    nnz = rng.integers(0, 12, n)
    nl = rng.integers(0, 4, n)
    rows_x = [np.sort(rng.choice(np.arange(1, n_features), k, replace=False)) for k in nnz]
    x_idx = [np.concatenate([[0], r]) for r in rows_x]
    x_val = [
        np.concatenate([[i + 1.0], np.round(rng.random(len(r)), 3) + 0.001])
        for i, r in enumerate(rows_x)
    ]
    X = CSR(
        np.concatenate([[0], np.cumsum([len(r) for r in x_idx])]),
        np.concatenate(x_idx),
        np.concatenate(x_val),
        n_features,
    )
    Y = CSR.from_lists([np.sort(rng.choice(n_labels, k, replace=False)) for k in nl], n_labels)
    return XCDataset(X, Y)


def row_ids(d: XCDataset) -> np.ndarray:
    return d.X.data[d.X.indptr[:-1]].astype(np.int64) - 1


def assert_same(a: XCDataset, b: XCDataset) -> None:
    assert a.X.shape == b.X.shape and a.Y.shape == b.Y.shape
    for m, n in ((a.X, b.X), (a.Y, b.Y)):
        np.testing.assert_array_equal(m.indptr, n.indptr)
        np.testing.assert_array_equal(m.indices, n.indices)
    np.testing.assert_array_equal(a.X.data, b.X.data)


def read_all(src: DataSource, skip: bool = False) -> tuple[XCDataset, int]:
    """Every partition in storage order, point counts checked."""
    outs = [read_partition(p, skip) for p in src.partitions]
    check_point_counts(src.partitions, [len(d) + k for d, k in outs])
    return concat([d for d, _ in outs], src.n_features, src.n_labels), sum(k for _, k in outs)


def indexed(src: DataSource) -> DataSource:
    return dataclasses.replace(src, partitions=tuple(index_partitions(src.partitions)))


def put(url: str, data: bytes, **so) -> str:
    with fsspec.open(url, "wb", **so) as f:
        f.write(data)
    return url


def text_of(d: XCDataset) -> bytes:
    write_xc("memory://scratch/t.txt", d)
    with fsspec.open("memory://scratch/t.txt", "rb") as f:
        return f.read()

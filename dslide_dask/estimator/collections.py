"""Dask collections as training and inference input.

Every form is cut into row blocks, each made a data set (or a CSR of features) by a
task that runs where its chunks are: a dask array of scipy, pydata/sparse or numpy
chunks (``X`` with a 2-D label array ``Y``), a dask bag of ``(x, labels)`` rows, or a
dask dataframe with one column of feature rows and one of label lists (not covered by
the tests: their environment has no pandas). A model in this process computes the
blocks and stacks them here; a model on a cluster keeps them there as futures
(:class:`~dslide_dask.distributed.cluster_data.ClusterData`), so the rows go from the
workers that made them to the model's worker, never through the client.
"""

from __future__ import annotations

import sys

import numpy as np

from dslide_dask.data import blocks
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset


def is_dask_collection(obj) -> bool:
    """Whether ``obj`` is a Dask collection, without importing dask for other inputs."""
    if "dask" not in sys.modules:
        return False
    from dask import is_dask_collection as check

    return check(obj)


def is_rows(X) -> bool:
    """A Dask bag or dataframe of rows (labels inside, no ``Y``)."""
    return is_dask_collection(X) and hasattr(X, "npartitions") and not hasattr(X, "chunks")


# -- blocks (lazy: dask.delayed objects, one per row block) -----------------------------------
def dataset_blocks(X, Y=None) -> list:
    """One delayed :class:`XCDataset` per row block of ``X`` and ``Y`` (two 2-D dask
    arrays), or per partition of a bag or dataframe of rows (``Y`` None)."""
    from dask import delayed

    if is_rows(X):
        if hasattr(X, "columns"):
            x_col, y_col = _frame_columns(X)
            return [delayed(blocks.frame_block)(p, x_col, y_col) for p in X.to_delayed()]
        return [delayed(blocks.bag_block)(p) for p in X.to_delayed()]
    rows_x = feature_blocks(X, "X")
    Yd = _two_d(Y, "Y")
    if Yd.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but Y has {Yd.shape[0]}")
    rows_y = Yd.rechunk({0: rows_x.chunks[0], 1: -1})
    return [
        delayed(blocks.array_block)(rows_x.blocks[i, 0], rows_y.blocks[i, 0], int(Yd.shape[1]))
        for i in range(rows_x.numblocks[0])
    ]


def feature_blocks(X, name: str = "X"):
    """``X`` (a 2-D dask array) with its columns in one chunk: a block per row block."""
    _two_d(X, name)
    return X.rechunk({1: -1}) if X.numblocks[1] > 1 else X


def _two_d(A, name: str):
    if not is_dask_collection(A) or getattr(A, "ndim", None) != 2:
        raise ValueError(
            f"{name}: expected a 2-D dask array (with a dask array X, Y must be a 2-D dask "
            f"array of 0/1 labels), got {type(A).__name__} of {getattr(A, 'ndim', '?')} dims"
        )
    if any(np.isnan(c) for c in A.shape):
        raise ValueError(
            f"{name}: a dask array of unknown chunk sizes (from a dataframe or a filter); "
            "call .compute_chunk_sizes() first"
        )
    return A


def _frame_columns(df) -> tuple:
    cols = list(df.columns)
    x_col = next((c for c in ("X", "features") if c in cols), cols[0])
    y_col = next((c for c in ("Y", "labels") if c in cols), cols[-1])
    if x_col == y_col:
        raise ValueError("a dask dataframe for fit needs a column of features and one of labels")
    return x_col, y_col


# -- assembling ------------------------------------------------------------------------------
def dataset_here(parts: list) -> XCDataset:
    """Delayed blocks (:func:`dataset_blocks`) computed by the current scheduler and
    stacked in this process."""
    import dask

    return blocks.stack_datasets(dask.compute(*parts))


def csr_here(X, name: str = "X", pattern: bool = False, n_cols: int | None = None) -> CSR:
    """A 2-D dask array as one CSR in this process, its blocks made sparse where they are
    (never densified here)."""
    import dask

    rows = feature_blocks(X, name)
    width = n_cols or int(X.shape[1])
    make = dask.delayed(blocks.block_csr)
    parts = dask.compute(
        *[make(rows.blocks[i, 0], width, pattern, name) for i in range(rows.numblocks[0])]
    )
    return blocks.stack(parts, width)

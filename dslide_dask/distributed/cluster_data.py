"""Data that stays on the cluster: row blocks held by workers as futures.

A model on a cluster trains on rows that Dask collections made on the workers: the
blocks are stacked by a task pinned to the coordinator's worker (Dask moves each block
there from wherever it was made) and handed to the coordinator in that process, to train
or evaluate on; top-k inference on a dask array runs as one task per block that asks the
coordinator. None of them brings rows to the client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dslide_dask.data.blocks import block_csr, stack_datasets
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset


@dataclass(frozen=True)
class ClusterData:
    """A data set as futures of its row blocks (:class:`XCDataset` each), in row order;
    the client keeps the futures, and with them the blocks, alive."""

    parts: tuple
    n_points: int
    n_features: int
    n_labels: int

    @classmethod
    def persist(cls, client, blocks: list) -> ClusterData:
        """Compute ``blocks`` (delayed data sets) on the cluster and keep them there;
        only each block's shape comes back."""
        parts = client.compute(blocks)
        shapes = client.gather(client.map(_shape, parts, pure=False))
        n_points = sum(s[0] for s in shapes)
        if n_points == 0:
            raise ValueError("X and Y have no rows: there is nothing to train on")
        return cls(tuple(parts), n_points, max(s[1] for s in shapes), max(s[2] for s in shapes))


def _shape(data: XCDataset) -> tuple[int, int, int]:
    return data.n_points, data.n_features, data.n_labels


def on_coordinator(coordinator, call: tuple[str, dict, int, int], *parts: XCDataset):
    """Task on the coordinator's worker: the blocks as one data set of ``n_features`` and
    ``n_labels``, passed to the coordinator's ``method`` with ``kwargs``, where
    ``call = (method, kwargs, n_features, n_labels)``; what that returns."""
    method, kwargs, n_features, n_labels = call
    data = stack_datasets(parts, n_features, n_labels)
    return getattr(coordinator, method)(data, **kwargs).result()


def topk_array(rows, coordinator, k: int, exact: bool):
    """Top-k label ids of a 2-D dask array of rows (its columns in one chunk) as a dask
    array, one task per block asking the coordinator."""
    import uuid

    return rows.map_blocks(
        _topk_block,
        coordinator,
        k=k,
        exact=exact,
        n_cols=int(rows.shape[1]),
        dtype=np.int64,
        chunks=(rows.chunks[0], (k,)),
        name=f"topk-{uuid.uuid4().hex}",
    )


def _topk_block(block, coordinator, *, k: int, exact: bool, n_cols: int) -> np.ndarray:
    X: CSR = block_csr(block, n_cols)
    return coordinator.topk(X, k, exact).result()

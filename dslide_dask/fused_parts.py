"""The fused parts of a trained model, wherever they were built: one interface.

After a fit the network's trainer holds the network; :func:`build_fused_parts` builds the
rest of the model (:class:`~dslide_dask.model.fused.FusedModel`) where the rows are: in
this process for a model in this process, on a worker for a model on a cluster
(:class:`~dslide_dask.distributed.fused_build.RemoteFused`, never bringing the rows
here). Either answers, scores and saves the whole model the same way, so the CLI and the
estimator wire one thing.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from dslide_dask.checkpoint.fused import save_fused
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import read_split
from dslide_dask.data.partitions import DataSource
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.model.fused import FusedModel
from dslide_dask.model.fused_build import FusedBuild, Report
from dslide_dask.model.fused_size import RowStats, block_counts
from dslide_dask.model.network_answers import metrics_with_network


class FusedParts(Protocol):
    """A trained model's fused parts, with the network they rank beside."""

    def topk(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``k`` best labels by the whole model, and their scores."""

    def metrics(
        self, data: XCDataset, ks: tuple[int, ...] = (1, 3, 5), exact: bool = True
    ) -> dict[str, float]:
        """P@k, nDCG@k and PSP@k of the whole model on ``data`` (and, with exact
        answers, the network's own P@k from the same pass: ``network P@k``)."""

    def metric_args(self) -> dict:
        """PSP@k's label counts for :func:`~dslide_dask.metrics.xc_metrics`, as
        :meth:`metrics` takes them (on a cluster: brought from the model's worker)."""

    def parts(self, storage_options: dict | None = None) -> Any:
        """A parts writer for the trainer's ``save`` (the fused parts, before the commit)."""

    def chosen(self) -> tuple[tuple[float, ...], float]:
        """The fusion weights and tail exponent the fit chose."""

    def model(self) -> FusedModel | None:
        """The fused model itself, if it is in this process (never brought here)."""

    def close(self) -> None:
        """Let go of the parts (on a cluster: the worker's memory)."""


class LocalFused:
    """Fused parts in this process, beside a network in this process."""

    def __init__(self, fused: FusedModel, trainer: LocalTrainer) -> None:
        self.fused, self.trainer = fused, trainer

    def topk(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        return self.fused.topk(self.trainer, X, k, exact)

    def metrics(
        self, data: XCDataset, ks: tuple[int, ...] = (1, 3, 5), exact: bool = True
    ) -> dict[str, float]:
        return metrics_with_network(self.fused, self.trainer, data.X, data.Y, ks, exact)

    def metric_args(self) -> dict:
        return self.fused.metric_args()

    def parts(self, storage_options: dict | None = None):
        def write(folder_url: str, meta: dict) -> dict:
            return save_fused(folder_url, self.fused, storage_options)

        return write

    def chosen(self) -> tuple[tuple[float, ...], float]:
        return self.fused.weight, self.fused.fusion.tail

    def model(self) -> FusedModel | None:
        return self.fused

    def close(self) -> None:
        pass


def row_stats(client: Any, source: Any, skip_bad_lines: bool = False) -> RowStats:
    """The training rows' :class:`~dslide_dask.model.fused_size.RowStats` (whether most
    labels are rare, what the fused parts will take), counted where the rows are (on the
    workers for a cluster's data, read here without a client)."""
    if client is None:
        data, _ = read_split(source, None, skip_bad_lines)
        counts, sums, n_points, nnz = block_counts(data)
        return RowStats.of_counts(data.n_features, counts, sums, n_points, nnz)
    from dslide_dask.distributed.fused_build import row_stats as on_cluster

    return on_cluster(client, source, skip_bad_lines)[1]


def build_fused_parts(
    trainer: Any,
    source: XCDataset | DataSource,
    build: FusedBuild,
    client: Any = None,
    *,
    report: Report | None = None,
) -> FusedParts:
    """The fused parts of ``trainer``'s model on the rows of ``source`` (those held out
    of the network's training as ``build.held`` says), built where the model is
    (``report``: told each stage done)."""
    if isinstance(trainer, LocalTrainer):
        train, held = read_split(source, build.held, build.skip_bad_lines)
        return LocalFused(build.recipe.build(train, held, trainer, None, report), trainer)
    from dslide_dask.distributed.fused_build import RemoteFused

    return RemoteFused.build(client or trainer.client, trainer, source, build, report=report)

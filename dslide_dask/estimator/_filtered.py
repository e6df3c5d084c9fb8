"""``predict_topk(..., exclude=...)`` and ``evaluate(..., exclude=...)``: answers, and
P@k, with labels left out of each row's answers.

The XC Repository's label-feature sets ship ``filter_labels_test.txt``: for each test
row, labels (its own item, or one linked both ways) that published evaluations drop from
its predictions before P@k is taken. Every path ``evaluate`` takes (in this process, a
cluster's network, fused parts on a worker, the output index) answers ``predict_topk``,
so the filter is applied to that one answer, widened by the most labels any row drops;
a dask array's answer block by block, on the workers, each block its own rows' pairs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dslide_dask.checkpoint.label_counts import training_labels
from dslide_dask.data.csr import CSR, as_csr
from dslide_dask.data.label_pairs import LabelPairs
from dslide_dask.estimator import collections
from dslide_dask.metrics import (
    drop_pairs,
    drop_scored_pairs,
    excluded_pairs,
    widened,
    widest_exclusion,
    xc_metrics,
)

if TYPE_CHECKING:
    from dslide_dask.estimator._state import EstimatorState


def metric_args(estimator: EstimatorState) -> dict:
    """PSP@k's label counts, from where the model's own ``evaluate`` takes them: the
    fused parts' indexed rows (on a cluster: brought from their worker), else the rows
    the network trained on ({} when none were counted: no PSP@k)."""
    built = getattr(estimator, "_fused_parts", None)
    if built is not None:
        return built.metric_args()
    if getattr(estimator, "neighbours_", None) is not None:
        return estimator._fused().metric_args()
    labels = training_labels(estimator.trainer_)
    return labels.metric_args() if labels is not None else {}


def filtered_topk(estimator: EstimatorState, X, k: int, exclude, exact: bool, scores: bool):
    """``predict_topk``'s answer without each row's ``exclude`` labels (``X``'s rows)."""
    _multi_label_only(estimator)
    n_labels = estimator.trainer_.n_labels
    gone = _pairs(estimator, exclude, _n_rows(X), "X")
    width = widened(k, widest_exclusion(gone), n_labels)
    got = estimator.predict_topk(X, width, exact=exact, return_scores=scores)
    if scores:
        ids, values = got
        return drop_scored_pairs(ids, values, gone, k)
    if collections.is_dask_collection(got):
        return got.map_blocks(
            _drop_block, gone, k, dtype=got.dtype, chunks=(got.chunks[0], (k,)),
            meta=np.empty((0, 0), got.dtype),
        )  # fmt: skip
    return drop_pairs(got, gone, k)


def _pairs(estimator: EstimatorState, exclude, n_rows: int, rows_of: str) -> CSR:
    """``exclude`` as a pattern matrix of ``n_rows`` rows: label sets as ``Y`` gives them,
    or the :class:`~dslide_dask.data.label_pairs.LabelPairs` of ``read_pairs`` (a pair
    past the rows named with its line)."""
    n_labels = estimator.trainer_.n_labels
    if isinstance(exclude, LabelPairs):
        if exclude.n_labels != n_labels:
            raise ValueError(
                f"exclude: pairs read for {exclude.n_labels:,} labels, the model has {n_labels:,}"
            )
        return exclude.matrix(n_rows, rows_of=f"{rows_of}'s")
    return excluded_pairs(estimator._labels(exclude, "exclude"), n_rows, n_labels, rows_of)


def _multi_label_only(estimator: EstimatorState) -> None:
    if estimator._multiclass:
        raise ValueError(
            "exclude= leaves labels out of a multi-label model's answers; this model "
            "gives one class per row"
        )


def _drop_block(block: np.ndarray, exclude: CSR, k: int, block_info=None) -> np.ndarray:
    start, stop = block_info[0]["array-location"][0]
    return drop_pairs(block, exclude.slice_rows(start, stop), k)


def _n_rows(X) -> int:
    """The rows of ``X`` (a matrix, a dask collection or a list of rows), before any is
    read: the pairs are checked against them first."""
    shape = getattr(X, "shape", None)
    n = shape[0] if shape is not None else len(X)
    if not isinstance(n, int | np.integer):  # a dask collection of unknown length
        raise ValueError(
            "exclude= needs X's row count before it is read, and X's is unknown (a dask "
            "array of unknown chunk sizes: X.compute_chunk_sizes())"
        )
    return int(n)


def filtered_metrics(
    estimator: EstimatorState, X, Y, exclude, ks: tuple[int, ...], exact: bool
) -> dict[str, float]:
    """``evaluate``'s metrics of the answers without each row's ``exclude`` labels."""
    _multi_label_only(estimator)
    n_labels = estimator.trainer_.n_labels
    truth = as_csr(estimator._labels(Y), n_labels, pattern=True, name="Y")
    gone = _pairs(estimator, exclude, truth.n_rows, "Y")
    top = filtered_topk(estimator, X, max(ks), gone, exact, scores=False)
    top = top.compute() if collections.is_dask_collection(top) else top
    return xc_metrics(top, truth, ks, **metric_args(estimator))

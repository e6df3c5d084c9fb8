"""``evaluate(..., exclude=...)``: P@k with labels left out of each row's answers.

The XC Repository's label-feature sets ship ``filter_labels_test.txt``: for each test
row, labels (its own item, or one linked both ways) that published evaluations drop from
its predictions before P@k is taken. Every path ``evaluate`` takes (in this process, a
cluster's network, fused parts on a worker, the output index) answers ``predict_topk``,
so the filter is applied to that one answer, widened by the most labels any row drops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dslide_dask.checkpoint.label_counts import training_labels
from dslide_dask.data.csr import as_csr
from dslide_dask.estimator import collections
from dslide_dask.metrics import excluded_pairs, topk_without, xc_metrics

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


def filtered_metrics(
    estimator: EstimatorState, X, Y, exclude, ks: tuple[int, ...], exact: bool
) -> dict[str, float]:
    """``evaluate``'s metrics of the answers without each row's ``exclude`` labels."""
    if estimator._multiclass:
        raise ValueError(
            "exclude= leaves labels out of a multi-label model's answers; this model "
            "gives one class per row"
        )
    n_labels = estimator.trainer_.n_labels
    truth = as_csr(estimator._labels(Y), n_labels, pattern=True, name="Y")
    gone = excluded_pairs(estimator._labels(exclude, "exclude"), truth.n_rows, n_labels)

    def topk_of(width: int) -> np.ndarray:
        top = estimator.predict_topk(X, width, exact=exact)
        return top.compute() if collections.is_dask_collection(top) else top

    top = topk_without(topk_of, gone, max(ks))
    return xc_metrics(top, truth, ks, **metric_args(estimator))

"""The work of one input partition, as the functions a prediction graph's tasks run.

No Dask here: each function takes picklable values and the per-worker model from
:mod:`.model_cache`. ``read -> hidden -> shard top-k (one per shard) -> merge and write``;
a model with fused parts: ``read -> fused top-k and write`` (the whole model on the
worker, :class:`ServedNetwork` answering the fusion's questions).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dslide_dask.data.csr import CSR, SCORE_ROWS, row_ranges
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.label_pairs import LabelPairs
from dslide_dask.data.source import Partition, read_partition
from dslide_dask.inference import model_cache
from dslide_dask.inference.output import write_part
from dslide_dask.inference.spec import PredictSpec
from dslide_dask.metrics import drop_pairs, drop_scored_pairs, metric_sums
from dslide_dask.model.network import SlideNetwork
from dslide_dask.model.wide_shard import merge_topk_scores


def read_rows(part: Partition) -> CSR:
    """The feature rows of one input partition (labels, if any, are dropped)."""
    data, _ = read_partition(part)
    return data.X


def read_data(part: Partition) -> XCDataset:
    """The rows and labels of one partition of a test set."""
    data, _ = read_partition(part)
    return data


def features(data: XCDataset) -> CSR:
    return data.X


def score_part(
    spec: PredictSpec,
    answers: tuple[np.ndarray, np.ndarray],
    data: XCDataset,
    ks: tuple[int, ...],
    start: int = 0,
    pairs: LabelPairs | None = None,
) -> dict[str, float]:
    """The metric sums (:func:`~dslide_dask.metrics.metric_sums`) of one partition's
    answers, its rows' ``pairs`` left out first (its first row the input's ``start``),
    with PSP@k's label counts from the model, as ``evaluate`` takes them."""
    ids = answers[0]
    if pairs is not None:
        ids = drop_pairs(ids, pairs.rows_between(start, start + len(ids)), max(ks))
    p = model_cache.propensities(spec)
    Y = data.Y  # as wide as the model's labels (a test file may declare fewer)
    Y = CSR(Y.indptr, Y.indices, None, len(p)) if p is not None else Y
    return metric_sums(ids[:, : max(ks)], Y, ks, p)


def hidden(spec: PredictSpec, X: CSR) -> np.ndarray:
    """Last hidden activations of the rows."""
    h, _ = model_cache.model(spec).hidden.forward(X)
    return h


def shard_topk(
    spec: PredictSpec, h: np.ndarray, shard: int, batch_size: int = SCORE_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """One shard's best k ``(global ids, scores)`` per row, ``batch_size`` rows at a time."""
    part = model_cache.model(spec).shards[shard]
    query = None if spec.exact else spec.query()
    ids = np.empty((len(h), spec.k), np.int64)
    scores = np.empty((len(h), spec.k), np.float32)
    for start, stop in row_ranges(len(h), batch_size):
        ids[start:stop], scores[start:stop] = part.topk(h[start:stop], spec.k, spec.exact,
                                                        query=query)  # fmt: skip
    return ids, scores


def merge_write(spec: PredictSpec, parts: list, out_url: str, index: int) -> dict:
    """Merge every shard's top-k of partition ``index`` and write them under ``out_url``."""
    return write_part(out_url, index, merge_topk_scores(parts, spec.k), spec.storage_options)


def merge(spec: PredictSpec, parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Every shard's top-k of one partition merged: its rows' top-k ``(ids, scores)``."""
    return merge_topk_scores(parts, spec.k)


def count_rows(X: CSR) -> int:
    return X.n_rows


def next_start(start: int, n_rows: int) -> int:
    """The first row of the partition after one of ``n_rows`` rows from ``start``."""
    return start + n_rows


def write_kept(
    spec: PredictSpec,
    answers: tuple[np.ndarray, np.ndarray],
    start: int,
    pairs: LabelPairs,
    k: int,
    out_url: str,
    index: int,
) -> dict:
    """Partition ``index``'s answers (its first row the input's row ``start``) without
    their rows' ``pairs``, the first ``k`` of each row written under ``out_url``."""
    ids, scores = answers
    exclude = pairs.rows_between(start, start + len(ids))
    return write_part(out_url, index, drop_scored_pairs(ids, scores, exclude, k),
                      spec.storage_options)  # fmt: skip


class ServedNetwork:
    """The worker's network as fusion asks it (:class:`~dslide_dask.model.fused.Network`):
    its candidates found as ``spec`` says (exactly, by LSH tables or the output index);
    loaded when first asked (fused parts that never ask it leave it unread)."""

    def __init__(self, spec: PredictSpec) -> None:
        self.spec = spec

    @property
    def net(self) -> SlideNetwork:
        return model_cache.model(self.spec)

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        return predict_topk_scores(self.net, X, replace(self.spec, k=k))

    def embed(self, X: CSR, batch_size: int = SCORE_ROWS) -> np.ndarray:
        parts = [
            self.net.hidden.forward(X.slice_rows(start, stop))[0]
            for start, stop in row_ranges(X.n_rows, batch_size, at_least_one=True)
        ]
        return np.concatenate(parts).astype(np.float32, copy=False)


def fused_topk_scores(spec: PredictSpec, X: CSR) -> tuple[np.ndarray, np.ndarray]:
    """The whole model's top-k ``(ids, scores)`` of rows ``X``: the network's candidates
    fused with the neighbours' votes, centroids and label trees (the network alone for a
    model without fused parts)."""
    fused = model_cache.fused(spec)
    if fused is None:
        return predict_topk_scores(model_cache.model(spec), X, spec)
    return fused.topk(ServedNetwork(spec), X, spec.k, spec.exact)


def fused_write(spec: PredictSpec, X: CSR, out_url: str, index: int) -> dict:
    """Partition ``index``'s fused top-k, written under ``out_url``."""
    return write_part(out_url, index, fused_topk_scores(spec, X), spec.storage_options)


def predict_topk_scores(
    net: SlideNetwork, X: CSR, spec: PredictSpec, batch_size: int = SCORE_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ``(ids, scores)`` of rows ``X`` in this process: the same arithmetic as a
    prediction graph (the reference its output is checked against)."""
    ids = np.empty((X.n_rows, spec.k), np.int64)
    scores = np.empty((X.n_rows, spec.k), np.float32)
    query = None if spec.exact else spec.query()
    for start, stop in row_ranges(X.n_rows, batch_size):
        h, _ = net.hidden.forward(X.slice_rows(start, stop))
        parts = [s.topk(h, spec.k, spec.exact, query=query) for s in net.shards]
        ids[start:stop], scores[start:stop] = merge_topk_scores(parts, spec.k)
    return ids, scores

"""How many bytes the fused parts of a model take, worked out before they are built.

The neighbours keep the training rows twice (the rows, and the index's postings), their
labels and one hidden vector a row; the label centroids keep, for each label, the
features of its rows that weigh at least :data:`~dslide_dask.model.label_centroids.PRUNE`
of its unit norm; a label tree keeps each label's and each cluster's sparse classifier,
about as many weights as the centroids have entries. The rows' statistics
(:class:`RowStats`) come from one pass over the training rows, made where they are
(``dslide_dask.distributed.fused_build.row_stats``), or from a sample (``dslide plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dslide_dask.model.label_centroids import PRUNE
from dslide_dask.model.label_tree import mostly_rare_counts

#: A centroid entry weighs at least PRUNE of a unit norm: at most this many a label.
CENTROID_CAP = int(1 / PRUNE**2)
#: Centroid entries kept, of :attr:`RowStats.centroid_bound` (the labels' rows' non-zeros,
#: each label's capped): 0.78-0.79 measured on ``amazon-3m``'s first 100K and 300K rows
#: (rows of a label share few features), 0.42 on Debian-26K (they share many). The
#: largest: a plan errs towards refusing.
CENTROID_KEPT = 0.8
#: A label tree's weights, of :attr:`RowStats.centroid_bound`: 1.44 measured on
#: ``amazon-3m``'s 300K rows, 0.60 on Debian-26K.
TREE_KEPT = 1.5
#: Bytes of one sparse entry (int32 feature, float32 value).
ENTRY = 8


@dataclass(frozen=True)
class RowStats:
    """The training rows' shape and non-zeros: ``feature_nnz`` of the inputs,
    ``label_nnz`` of the labels, and ``centroid_bound``, the sum over the labels of the
    non-zeros of their rows (each label's at most :data:`CENTROID_CAP`)."""

    n_points: int
    n_features: int
    n_labels: int
    feature_nnz: int
    label_nnz: int
    centroid_bound: int
    mostly_rare: bool = False

    @classmethod
    def of_counts(
        cls,
        n_features: int,
        counts: np.ndarray,
        row_nnz_sums: np.ndarray,
        n_points: int,
        feature_nnz: int,
    ) -> RowStats:
        """From each label's count of rows and the sum of its rows' non-zeros."""
        bound = np.minimum(row_nnz_sums, min(CENTROID_CAP, n_features)).sum()
        return cls(
            n_points,
            n_features,
            len(counts),
            int(feature_nnz),
            int(counts.sum()),
            int(bound),
            mostly_rare_counts(counts),
        )

    def scaled(self, n_points: int) -> RowStats:
        """These statistics of a sample, scaled up to ``n_points`` rows."""
        f = n_points / max(1, self.n_points)
        return RowStats(
            n_points,
            self.n_features,
            self.n_labels,
            round(self.feature_nnz * f),
            round(self.label_nnz * f),
            round(self.centroid_bound * f),
            self.mostly_rare,
        )


def fused_bytes(
    stats: RowStats, width: int, centroids: bool, trees: int, classified: int = 0
) -> dict[str, int]:
    """The parts' bytes of a fused model of rows ``stats`` (``width``: the hidden vector's;
    ``trees``: label trees, 0 for none; ``centroids``: whether they are kept; the trees
    need them while they are built), and ``build``: what building them holds besides, a
    second copy of the rows while every row's index is built (the network's rows' index
    and centroids are let go first: :meth:`~.fused_build.FusedRecipe.build`)."""
    n, f, y = stats.n_points, stats.feature_nnz, stats.label_nnz
    rows = ENTRY * f + 4 * y + 16 * (n + 1)
    index = ENTRY * f + ENTRY * (stats.n_features + 1) + 4 * y + 8 * (n + 1)
    entries = CENTROID_KEPT * stats.centroid_bound
    cent = round(ENTRY * entries) + 8 * (stats.n_labels + 1)
    parts = {
        "rows": rows,
        "index": index,
        "embedding": 4 * n * width,
        "centroids": cent if centroids or trees else 0,
        "trees": round(trees * TREE_KEPT * ENTRY * stats.centroid_bound),
        "classifiers": 4 * classified * stats.n_features,
    }
    parts["build"] = rows
    return parts


@dataclass(frozen=True)
class FusedBytes:
    """Where the fused parts' bytes fall at their build's peak: ``last`` on the worker
    that builds them, and the label trees' weights (``trees``) in pieces over every
    worker, each holding the rows its nodes train on (``problem``) while they train
    (``dslide_dask.distributed.tree_shards``); on one worker, all of it there."""

    last: int = 0
    trees: int = 0
    problem: int = 0

    @classmethod
    def of_parts(cls, parts: dict[str, int]) -> FusedBytes:
        """From :func:`fused_bytes`' parts."""
        return cls(sum(parts.values()) - parts["trees"], parts["trees"], parts["rows"])

    def on(self, worker: int, n_workers: int) -> int:
        """The bytes worker ``worker`` of ``n_workers`` (the last builds) holds."""
        if n_workers < 2 or not self.trees:
            return self.last + self.trees if worker == n_workers - 1 else 0
        piece = -(-self.trees // n_workers) + self.problem
        return piece + (self.last if worker == n_workers - 1 else 0)

    def __bool__(self) -> bool:
        return bool(self.last or self.trees)


#: No fused parts.
NO_FUSED = FusedBytes()


def block_counts(data, n_labels: int | None = None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """A block of rows' (an ``XCDataset``'s) label counts, each label's sum of its rows'
    non-zeros, its rows and its non-zeros: what :func:`summed` adds up over blocks
    (``n_labels``: the whole set's, where a block knows only the labels it has)."""
    Y = data.Y
    n = data.n_labels if n_labels is None else n_labels
    per_label = np.repeat(np.diff(data.X.indptr).astype(np.float64), np.diff(Y.indptr))
    return (
        np.bincount(Y.indices, minlength=n).astype(np.int64),
        np.bincount(Y.indices, weights=per_label, minlength=n),
        int(data.n_points),
        int(data.X.indptr[-1]),
    )


def summed(parts: list[tuple]) -> tuple:
    """:func:`block_counts` of several blocks, added up."""
    return tuple(np.sum([p[i] for p in parts], axis=0) for i in range(4))

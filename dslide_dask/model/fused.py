"""The whole model a user is served: the network's answer fused with the training points'.

A :class:`FusedModel` is the :class:`~dslide_dask.model.neighbours.NeighbourIndex` (the
training rows, their hidden vectors, the label classifiers, centroids and trees) and the
:class:`Fusion` that weighs each source, apart from the network that trained beside it:
the network is whatever answers :class:`Network` (the in-process or distributed trainer,
a network loaded on a worker, through its output index or not). So the estimator, the
prediction graphs and ``dslide predict`` rank with one piece of code, and a model saved
by any of them is served the same everywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.metrics import metric_sums
from dslide_dask.model.config import check_float, check_int
from dslide_dask.model.fusion import (
    CENTROID_WEIGHTS,
    TAILS,
    candidate_union,
    filled,
    fused_topk,
    tree_rescored,
)
from dslide_dask.model.label_centroids import SCORED
from dslide_dask.model.neighbours import CANDIDATES, NeighbourIndex
from dslide_dask.model.output_index import IndexSettings
from dslide_dask.model.tree_shards import TreeLosses

#: The fused candidates the label trees re-rank, the best first: fewer than the centroids
#: score (:data:`~dslide_dask.model.label_centroids.SCORED`), as each costs a path's
#: classifiers; 300 gave the same P@k on debian-files-rare's saved scores (within 0.0006).
RERANKED = 100
#: A list of votes: per row, label ids (-1: none) and their scores.
Votes = tuple[np.ndarray, np.ndarray]
#: The largest power of a label tree's path likelihood (past 2 it all but decides alone).
MAX_TREE_POWER = 2.0
#: Fewest training points worth the serving indexes: below, scoring every point's
#: hidden vector takes under half a millisecond a row (128 wide), and small sets of
#: points are too few to fall into tight cells (5,000 points of the tiny preset: fused
#: recall@5 0.93 at the default cells).
MIN_POINTS = 20_000
#: Features held by more than this share of the training points are left out of the
#: postings a served row's input votes read (the points they propose are then scored
#: exactly): chosen before that re-score, when the votes went 0.85 -> 0.45 ms a row for
#: P@1 -0.0002 (Debian-26K) and -0.0006 (debian-files) (docs/serving.md).
COMMON_SHARE = 0.1


class Network(Protocol):
    """What fusion asks of a network: its best labels with their logits, and the last
    hidden layer's output (the space the hidden-space neighbours are found in)."""

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> Votes: ...

    def embed(self, X: CSR) -> np.ndarray: ...


@dataclass(frozen=True)
class Fusion:
    """How the sources are weighed: ``k`` nearest points vote (found by ``(1 - mix) *
    cos_hidden + mix * cos_input`` in the hidden space), ``weight`` the sources'
    weights (input votes, hidden votes, label classifiers, centroids; the network gets
    ``1 - `` the first two) or None while a fit chooses them (every source asked),
    ``tail`` the inverse propensity's exponent, ``tree_power`` the label trees'
    likelihood's (0: no re-ranking)."""

    k: int
    mix: float = 0.0
    weight: tuple[float, ...] | None = None
    tail: float = 0.0
    tree_power: float = 0.0

    def __post_init__(self) -> None:
        check_int("neighbours", self.k, 1, 1 << 16)
        check_float("neighbour_mix", self.mix, 0.0, 1.0)
        check_float("tail_exponent", self.tail, 0.0, max(TAILS))
        check_float("label_tree", self.tree_power, 0.0, MAX_TREE_POWER)
        if self.weight is not None:
            check_weights(self.weight)

    def params(self) -> dict:
        """The settings by the estimator's parameter names (a saved model's ``fusion``
        block)."""
        weight = None if self.weight is None else list(self.weight)
        return {"neighbours": self.k, "neighbour_mix": self.mix, "neighbour_weight": weight,
                "tail_exponent": self.tail, "label_tree": self.tree_power}  # fmt: skip

    def asks_network(self, has_embedding: bool) -> bool:
        """Whether an answer asks the network anything: its candidates (unless the votes'
        weights leave it none) or the rows' hidden vectors (for hidden votes, where the
        points' hidden vectors are kept: ``has_embedding``)."""
        if self.weight is None:
            return True
        return sum(self.weight[:2]) < 1.0 or (self.weight[1] > 0 and has_embedding)


def check_weights(weight: tuple[float, ...]) -> None:
    """ValueError unless ``weight`` is 2-4 source weights: two in [0, 1] of sum at most 1,
    the classifiers' in [0, 1], the centroids' in [0, max(CENTROID_WEIGHTS)]."""
    highest = (1.0, 1.0, 1.0, max(CENTROID_WEIGHTS))
    if not 2 <= len(weight) <= 4 or sum(weight[:2]) > 1.0 + 1e-9:
        raise ValueError(
            f"the fusion weights must be 2 to 4, the first two of sum <= 1, got {weight}"
        )
    for value, top in zip(weight, highest, strict=False):
        check_float("the fusion weights", value, 0.0, top)


@dataclass(frozen=True, eq=False)
class FusedModel:
    """A network's answer fused with the points of :attr:`index` as :attr:`fusion` says."""

    index: NeighbourIndex
    fusion: Fusion

    @property
    def weight(self) -> tuple[float, ...]:
        if self.fusion.weight is None:
            raise RuntimeError("the fusion weights are not chosen yet")  # a fit sets them
        return self.fusion.weight

    def asks_network(self) -> bool:
        """Whether an answer asks the network anything (:meth:`Fusion.asks_network`)."""
        return self.fusion.asks_network(self.index.embedding is not None)

    def served(self, settings: IndexSettings | None = None) -> FusedModel:
        """This model answering through the neighbours' serving indexes, where it keeps
        enough points to gain (:func:`served_neighbours`; the points' search only if the
        hidden votes weigh): what ``build_index`` gives the estimator and ``dslide
        predict --index`` a worker."""
        hidden = self.fusion.weight is None or self.fusion.weight[1] > 0
        return dataclasses.replace(self, index=served_neighbours(self.index, settings, hidden))

    def candidates(self) -> int:
        """How many of the network's best labels the sources are fused over."""
        return min(CANDIDATES, self.index.n_labels)

    def votes(self, net: Network, X: CSR, weight: tuple[float, ...] = (1.0, 1.0)) -> list[Votes]:
        """The votes of the points nearest each row in the input, and in the hidden space
        once the index has the points' hidden vectors, then the label classifiers' scores
        if the index has them (asked unless ``weight`` has a third entry, 0). A source of
        ``weight`` 0 is not asked: its list is empty (on amazon-670k the fit gives the
        hidden votes 0, and asking them would double a served row's time)."""
        index, k, mix, m = self.index, self.fusion.k, self.fusion.mix, self.candidates()
        hidden = index.embedding is not None and weight[1] > 0
        near = None
        votes = [_none(X)]
        if weight[0] > 0 and hidden and mix > 0 and index.search is None and index.serving is None:
            votes = list(index.mixed_votes(net.embed(X), k, m, X, mix))  # one input pass
        elif weight[0] > 0 or (hidden and mix > 0 and index.search is not None):
            ids, shares, near = index.votes_and_points(X, k, m)
            votes = [(ids, shares) if weight[0] > 0 else _none(X)]
        if hidden and len(votes) < 2:
            embedded = net.embed(X)
            votes.append(index.embedding_votes(embedded, k, m, X, mix, near if mix > 0 else None))
        if index.classifiers is not None and (len(weight) < 3 or weight[2] > 0):
            votes += [_none(X)] * (2 - len(votes))  # their place is the third
            votes.append(index.classifier_votes(X, m))
        return votes

    def with_centroid_votes(
        self,
        X: CSR,
        net: Votes,
        votes: list[Votes],
        weight: tuple[float, ...] | None = None,
        tail: float = 0.0,
    ) -> list[Votes]:
        """``votes`` and the label centroids' cosines, if the index has them (unless
        ``weight``'s fourth entry is 0): with the weights known, for the
        :data:`~dslide_dask.model.label_centroids.SCORED` best labels of the network's
        (``net``: ids, logits) and the votes' fused scores; else (choosing the weights)
        for every candidate they name."""
        index = self.index
        if index.centroids is None or (weight is not None and len(weight) > 3 and not weight[3]):
            return votes
        if weight is None:
            candidates = candidate_union(net[0], votes)
        else:
            others = weight[:3]
            candidates, _ = fused_topk(*net, votes, others, SCORED, tail, index.inverse_propensity)
        votes = votes + [_none(X)] * (3 - len(votes))
        return [*votes, index.centroid_votes(X, candidates)]

    def topk(
        self, net: Network, X: CSR, k: int, exact: bool = True, trees: TreeLosses | None = None
    ) -> Votes:
        """Each row's ``k`` best labels by the fused score, and those scores (the network
        not asked where the votes' weights leave it none; ``trees``: the label trees
        where they are not in the index, a cluster's pieces)."""
        weight, tail, index = self.weight, self.fusion.tail, self.index
        m = max(k, self.candidates())
        # the network's weight is what the votes leave: none left, it is not asked (its
        # candidates would only fill the lists with labels that score 0 from it)
        ids, logits = net.topk_scores(X, m, exact) if sum(weight[:2]) < 1.0 else _none(X)
        votes = self.with_centroid_votes(X, (ids, logits), self.votes(net, X, weight), weight, tail)
        power = self.fusion.tree_power if index.trees or trees is not None else 0.0
        width = max(k, RERANKED) if power else k
        top, scores = fused_topk(ids, logits, votes, weight, width, tail, index.inverse_propensity)
        if power:
            if trees is not None:  # inf: out of the k best
                losses = trees.topk_losses(X, top, scores, power=power, k=k)
            else:
                losses = index.tree_topk_losses(X, top, scores, power, k)
            top, scores = tree_rescored(top, scores, losses, power, k)
        return _filled(top, scores, index.by_frequency)

    def metric_sums(
        self,
        net: Network,
        X: CSR,
        Y: CSR,
        ks: tuple[int, ...],
        exact: bool,
        trees: TreeLosses | None = None,
    ) -> dict:
        """What P@k, nDCG@k and PSP@k (propensities from the indexed rows) of the fused
        top-k of rows ``X`` with true labels ``Y`` divide, summed over the rows: blocks of
        rows scored apart add up (:func:`~dslide_dask.metrics.add_sums`), and
        :func:`~dslide_dask.metrics.metrics_of_sums` gives the metrics."""
        top, _ = self.topk(net, X, max(ks), exact, trees)
        return metric_sums(top, Y, ks, self.index.propensities)

    def metric_args(self) -> dict:
        """PSP@k's ``label_counts`` and ``n_train`` for :func:`xc_metrics`: those of the
        indexed rows (every training row, once the fit is over)."""
        return {"label_counts": self.index.label_counts, "n_train": self.index.n_points}


def served_neighbours(
    index: NeighbourIndex, settings: IndexSettings | None = None, hidden: bool = True
) -> NeighbourIndex:
    """``index`` answering faster where it keeps :data:`MIN_POINTS` points or more: the
    input's votes without the postings of the features most points hold
    (:data:`COMMON_SHARE`), and with ``hidden``, the hidden vectors behind an approximate
    search (a row's votes score the points it proposes, not all; ``settings``' seed and
    threads build it)."""
    if index.n_points < MIN_POINTS:
        return index
    if index.serving is None:
        index = index.with_serving_postings(COMMON_SHARE)
    if hidden and index.embedding is not None and index.search is None:
        settings = settings or IndexSettings()
        index = index.with_search(IndexSettings(seed=settings.seed, threads=settings.threads))
    return index


def _filled(top: np.ndarray, scores: np.ndarray, by_frequency: np.ndarray) -> Votes:
    """``top`` (and its ``scores``) with the rows its sources left short of k labels
    completed from ``by_frequency``, the labels most training points have first: a row
    far from every point, the network unasked, still gets k answers where the model has
    k labels. Not the network's: a model that weighs it 0 is served without reading it."""
    short = np.flatnonzero(top[:, -1] < 0) if top.shape[1] else np.empty(0, np.int64)
    if not short.size:
        return top, scores
    return filled(top, scores, short, by_frequency[: top.shape[1]])


def _none(X: CSR) -> Votes:
    """An empty list of votes for each row of ``X`` (a source not asked)."""
    return np.empty((X.n_rows, 0), np.int64), np.empty((X.n_rows, 0), np.float32)

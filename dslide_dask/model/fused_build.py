"""How a fit builds the fused parts of a model: one recipe, wherever the rows are.

A :class:`FusedRecipe` is what a fit was asked for (the parameters of the same names of
``SlideClassifier``, frozen, so it crosses process boundaries). From the rows the network
trained on, a few rows held out of its training, and the trained network (any
:class:`~dslide_dask.model.fused.Network`), it builds the :class:`FusedModel`: the
frequent labels' classifiers on the network's rows; the index of those rows (and their
label centroids), on which the fusion weights are chosen for the held rows; then the
index of every row, its label trees and its hidden vectors. The estimator builds from
rows in memory; on a cluster the same recipe runs on a worker, from the rows it reads
(:mod:`dslide_dask.distributed.fused_build`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dslide_dask.data.blocks import stack_datasets
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import HeldRows
from dslide_dask.model.config import check_float, check_int
from dslide_dask.model.fused import MAX_TREE_POWER, FusedModel, Fusion, Network, check_weights
from dslide_dask.model.fused_size import FusedBytes, RowStats, fused_bytes
from dslide_dask.model.fusion import CENTROID_WEIGHTS, TAILS, choose_weights
from dslide_dask.model.label_classifiers import LabelClassifiers
from dslide_dask.model.label_tree import trees_for
from dslide_dask.model.neighbours import CANDIDATES, MAX_TREES, NeighbourIndex
from dslide_dask.model.tree_nodes import NodeTrainer

#: Rows held out of the network's training to choose the weight on: 5% of the rows, at
#: most this many (enough to tell weights 0.1 apart); none below HELD_MIN_POINTS rows (under
#: 100 held rows would choose by noise).
HELD_MAX = 2000
HELD_SHARE = 0.05
HELD_MIN_POINTS = 2000
#: The weights (input, hidden neighbours) when too few rows are there to choose them on:
#: near the best of the real and synthetic sets measured (Debian-26K (0.1, 0.7),
#: debian-files (0.1, 0.9), amazon-670k (0.5, 0.5); docs/accuracy.md).
FALLBACK_WEIGHTS = (0.2, 0.5)
#: The tail exponent then: the default's (docs/accuracy.md).
FALLBACK_TAIL = 0.0
#: The label classifiers' weight then (the best of Debian-26K's 0.3-0.5 and debian-files'
#: 1.0; docs/accuracy.md).
FALLBACK_CLASSIFIER_WEIGHT = 0.5
#: The label centroids' weight then, when it is to be chosen (the default's).
FALLBACK_CENTROID_WEIGHT = 0.5
#: At most this many labels, the most frequent, get a classifier of their own (each costs
#: a pass's arithmetic over every row's features; debian-files gives 325 labels 100 rows).
MAX_CLASSIFIED = 1024


#: The fusion parameters and their defaults: ``SlideClassifier``'s (a test holds them
#: equal), which ``dslide train --opt`` and a config's ``model`` take too.
FUSION_DEFAULTS = {
    "neighbours": 30,
    "neighbour_weight": None,
    "neighbour_mix": 0.35,
    "tail_exponent": 0.0,
    "label_classifiers": 0,
    "label_centroids": 0.5,
    "label_tree": 0.5,
    "n_label_trees": None,
}


def given_weight(weight) -> tuple[float, float] | None:
    """``neighbour_weight`` as (input, hidden) weights (a number is the input's; None:
    left to the fit); ValueError naming it outside its range."""
    if weight is None:
        return None
    pair = (weight, 0.0) if isinstance(weight, int | float) else tuple(weight)
    if len(pair) != 2:
        raise ValueError(f"neighbour_weight must be a number or a pair, got {weight!r}")
    for value in pair:
        check_float("neighbour_weight", value, 0.0, 1.0)
    if sum(pair) > 1.0 + 1e-9:
        raise ValueError(f"neighbour_weight's two weights must sum to at most 1, got {pair}")
    return (float(pair[0]), float(pair[1]))


def recipe_from(params: dict, seed: int = 0) -> FusedRecipe | None:
    """The recipe of fusion parameters ``params`` (missing ones: :data:`FUSION_DEFAULTS`);
    None with ``neighbours`` 0 (the network answers alone). ValueError naming a bad one."""
    p = {**FUSION_DEFAULTS, **params}
    k = p["neighbours"]
    check_int("neighbours", k, 0, 1 << 16)
    if k == 0:
        return None
    return FusedRecipe(
        k,
        p["neighbour_mix"],
        given_weight(p["neighbour_weight"]),
        p["tail_exponent"],
        p["label_centroids"],
        p["label_classifiers"],
        p["label_tree"],
        p["n_label_trees"],
        seed,
    )


@dataclass(frozen=True)
class FusedRecipe:
    """What a fit was asked for: ``neighbours`` (k), ``mix``, the ``weight`` (input,
    hidden) and ``tail`` (None: chosen on held rows), the ``centroids``' weight (None:
    chosen; 0: none), ``label_classifiers`` (rows a label needs for one; 0: none), the
    ``label_tree`` power (0: no tree) and ``n_trees`` (None: by the share of rare
    labels), and the fit's ``seed``."""

    neighbours: int
    mix: float = 0.0
    weight: tuple[float, float] | None = None
    tail: float | None = None
    centroids: float | None = None
    label_classifiers: int = 0
    label_tree: float = 0.0
    n_trees: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("neighbours", self.neighbours, 1, 1 << 16)
        check_float("neighbour_mix", self.mix, 0.0, 1.0)
        if self.weight is not None:
            check_weights(self.weight)
        if self.tail is not None:
            check_float("tail_exponent", self.tail, 0.0, max(TAILS))
        if self.centroids is not None:
            check_float("label_centroids", self.centroids, 0.0, max(CENTROID_WEIGHTS))
        check_int("label_classifiers", self.label_classifiers, 0, 1 << 40)
        check_float("label_tree", self.label_tree, 0.0, MAX_TREE_POWER)
        if self.n_trees is not None:
            check_int("n_label_trees", self.n_trees, 1, MAX_TREES)

    def given(self) -> bool:
        """Whether nothing is left for held rows to choose."""
        return None not in (self.weight, self.tail, self.centroids)

    def n_held(self, n_points: int) -> int:
        """How many of ``n_points`` training rows are held out of the network's training
        to choose the weights on: 5% (at most 2,000), none when all are given or the rows
        are few."""
        if self.given() or n_points < HELD_MIN_POINTS:
            return 0
        return min(HELD_MAX, round(n_points * HELD_SHARE))

    def nbytes(self, stats: RowStats, width: int) -> FusedBytes:
        """The fused parts' bytes at their build's peak, of rows ``stats`` and a network
        whose last hidden layer is ``width`` wide (:mod:`.fused_size`)."""
        trees = self.n_trees or (2 if stats.mostly_rare else 1) if self.label_tree else 0
        classified = MAX_CLASSIFIED if self.label_classifiers else 0
        parts = fused_bytes(stats, width, self.centroids != 0.0, trees, classified)
        return FusedBytes.of_parts(parts)

    def classifiers(self, data: XCDataset) -> LabelClassifiers | None:
        """The frequent labels' classifiers, trained on ``data`` (None: none asked)."""
        if not self.label_classifiers:
            return None
        return LabelClassifiers.fit(
            data.X, data.Y, self.label_classifiers, MAX_CLASSIFIED, self.seed
        )

    def index(self, data: XCDataset, classifiers: LabelClassifiers | None) -> NeighbourIndex:
        """The index of ``data``'s rows, with ``classifiers`` and, unless the centroids'
        weight is 0, the labels' centroids."""
        index = NeighbourIndex.build(data.X, data.Y).with_classifiers(classifiers)
        return index if self.centroids == 0.0 else index.with_centroids()

    def fusion(self, weight: tuple[float, ...] | None, tail: float) -> Fusion:
        return Fusion(self.neighbours, self.mix, weight, tail, self.label_tree)

    def fallback(self, index: NeighbourIndex) -> tuple[tuple[float, ...], float]:
        """The weights and tail used when none are chosen, and which held rows must
        clearly beat: what was given, else the fallbacks, with a weight for each source
        ``index`` has (the classifiers' third, the centroids' fourth)."""
        weight: tuple[float, ...] = self.weight or FALLBACK_WEIGHTS
        c = FALLBACK_CLASSIFIER_WEIGHT if index.classifiers is not None else 0.0
        if index.centroids is not None:
            d = FALLBACK_CENTROID_WEIGHT if self.centroids is None else self.centroids
            weight = (*weight, c, d)
        elif index.classifiers is not None:
            weight = (*weight, c)
        return weight, FALLBACK_TAIL if self.tail is None else self.tail

    def choose(
        self, index: NeighbourIndex, net: Network, held: XCDataset
    ) -> tuple[tuple[float, ...], float]:
        """The fused weights and tail exponent scoring best on ``held`` (rows the network
        did not train on) with the votes of ``index`` (which has the network's hidden
        vectors of its points); what was given is kept."""
        fused = FusedModel(index, self.fusion(None, 0.0))
        ids, logits = net.topk_scores(held.X, min(CANDIDATES, index.n_labels), True)
        votes = fused.with_centroid_votes(held.X, (ids, logits), fused.votes(net, held.X))
        return choose_weights(
            ids,
            logits,
            votes,
            held.Y,
            index.inverse_propensity,
            self.weight,
            self.tail,
            self.centroids,
            self.fallback(index),
        )

    def finish(
        self,
        index: NeighbourIndex,
        data: XCDataset,
        held: XCDataset | None,
        net: Network,
        chosen: tuple[tuple[float, ...], float],
        nodes: NodeTrainer | None = None,
        report: Report | None = None,
    ) -> FusedModel:
        """The fused model at the end of a fit: the held rows indexed with the network's
        (``data``, of ``index``), the label trees of them all, every point's hidden
        vector, and the ``chosen`` weights and tail (``nodes`` trains the trees'
        classifiers: None, here; ``report`` is told each stage done)."""
        stage = Stages(report)
        if held is not None:
            data, index = self.whole(data, held, index.classifiers)
            stage(f"indexed all {data.n_points:,} rows")
        if self.label_tree:
            n = trees_for(data.Y.indices, data.n_labels) if self.n_trees is None else self.n_trees
            index = index.with_built_trees(self.seed, n, nodes)
            stage(f"{n} label tree{'s' if n > 1 else ''} of {data.n_labels:,} labels")
        index = index.with_embedding(net.embed(data.X))
        stage(f"hidden vectors of {data.n_points:,} rows")
        return FusedModel(index, self.fusion(*chosen))

    def build(
        self,
        data: XCDataset,
        held: XCDataset | None,
        net: Network,
        nodes: NodeTrainer | None = None,
        report: Report | None = None,
    ) -> FusedModel:
        """The whole fused model of a fit, at its end: from the rows the network trained
        on (``data``), the rows held out of its training (None: none) and the network
        (``nodes``: where the trees' classifiers are trained, None: here; ``report`` is
        told each stage done: a build can take minutes)."""
        stage = Stages(report)
        index = self.index(data, self.classifiers(data))
        stage(f"indexed {data.n_points:,} rows and their labels' centroids")
        if held is None:
            return self.finish(index, data, None, net, self.fallback(index), nodes, report)
        chosen = self.choose(index.with_embedding(net.embed(data.X)), net, held)
        stage(f"weights chosen on {held.n_points:,} held rows")
        classifiers = index.classifiers
        del index  # its centroids go before the whole set's are built (2 GB at amazon-3m)
        data, index = self.whole(data, held, classifiers)
        stage(f"indexed all {data.n_points:,} rows")
        return self.finish(index, data, None, net, chosen, nodes, report)

    def whole(
        self, data: XCDataset, held: XCDataset, classifiers: LabelClassifiers | None
    ) -> tuple[XCDataset, NeighbourIndex]:
        """Every row, the held ones last, and their index (``classifiers``: the network's
        rows')."""
        data = stack_datasets([data, held], data.n_features, data.n_labels)
        return data, self.index(data, classifiers)


#: Told each stage of a build done, in a line (``dslide train`` prints it).
Report = Callable[[str], None]


class Stages:
    """Tells ``report`` (None: nobody) what was done and the seconds it took."""

    def __init__(self, report: Report | None) -> None:
        self.report, self.t = report, time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.report is not None:
            now = time.perf_counter()
            self.report(f"{what} ({now - self.t:.1f} s)")
            self.t = now


@dataclass(frozen=True)
class FusedBuild:
    """What the building task is given: the recipe, the rows held out (None: none) and
    whether bad lines of text are skipped as the stream skipped them."""

    recipe: FusedRecipe
    held: HeldRows | None = None
    skip_bad_lines: bool = False


def held_split(data: XCDataset, n_held: int, seed: int) -> tuple[XCDataset, XCDataset | None]:
    """``(rows the network trains on, the n_held rows held out)`` of rows in memory, drawn
    at random from ``seed``."""
    if n_held == 0:
        return data, None
    order = np.random.default_rng([seed, 0x4E1]).permutation(data.n_points)
    return data.take(np.sort(order[n_held:])), data.take(np.sort(order[:n_held]))

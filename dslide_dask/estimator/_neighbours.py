"""The training points a ``SlideClassifier`` keeps to vote beside its network.

``neighbours`` (k) nearest training rows of a query vote for their labels; the votes and
the network's softmax are mixed with ``neighbour_weight``, with the frequent labels'
classifiers' scores and the label centroids' cosines (``label_classifiers``,
``label_centroids``), and rare labels lifted by ``tail_exponent``. With a weight left to
the fit (None), a few training rows (5%, at most
:data:`~dslide_dask.model.fused_build.HELD_MAX`) are held out of the network's training,
the settings that score best on them are chosen (again whenever the network has moved
when a prediction is asked mid-fit), and the held rows join the index at the end of the
fit. What is built is :class:`~dslide_dask.model.fused_build.FusedRecipe`'s, as a fit on
a cluster from storage builds it on a worker; ``partial_fit`` uses the network alone.
"""

from __future__ import annotations

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import HeldRows
from dslide_dask.estimator._inputs import _plain
from dslide_dask.estimator._state import EstimatorState
from dslide_dask.fused_parts import build_fused_parts
from dslide_dask.metrics import metrics_of_sums
from dslide_dask.model.config import check_float, check_int
from dslide_dask.model.fused import MAX_TREE_POWER, FusedModel, Fusion
from dslide_dask.model.fused_build import FusedBuild, FusedRecipe, given_weight, held_split
from dslide_dask.model.fusion import CENTROID_WEIGHTS, TAILS
from dslide_dask.model.label_tree import trees_for
from dslide_dask.model.neighbours import CANDIDATES, MAX_TREES, NeighbourIndex


class NeighboursMixin(EstimatorState):
    """``neighbours_`` (a :class:`NeighbourIndex`, or None), ``neighbour_weight_`` and
    ``tail_exponent_``."""

    def _neighbour_k(self) -> int:
        k = _plain(self.neighbours)
        check_int("neighbours", k, 0, 1 << 16)
        return k

    def _neighbour_mix(self) -> float:
        mix = _plain(self.neighbour_mix)
        check_float("neighbour_mix", mix, 0.0, 1.0)
        return float(mix)

    def _given_weight(self) -> tuple[float, float] | None:
        """``neighbour_weight`` as (input, hidden) weights: a number is the input's."""
        return given_weight(_plain(self.neighbour_weight))

    def _given_tail(self) -> float | None:
        return self._optional_float("tail_exponent", max(TAILS))

    def _label_classifiers(self) -> int:
        """``label_classifiers``: the training rows a label needs for a classifier (0: none)."""
        count = _plain(self.label_classifiers)
        check_int("label_classifiers", count, 0, 1 << 40)
        return count

    def _label_centroids(self) -> float | None:
        """``label_centroids``: the centroids' weight (None: chosen; 0: no centroids)."""
        return self._optional_float("label_centroids", max(CENTROID_WEIGHTS))

    def _label_tree(self) -> float:
        """``label_tree``: the power of the tree's path likelihood (0: no tree)."""
        power = _plain(self.label_tree)
        check_float("label_tree", power, 0.0, MAX_TREE_POWER)
        return float(power)

    def _indexes(self, data) -> bool:
        """Whether a fit on ``data`` indexes its rows for the neighbours (and ranks the
        network's candidates with them): with ``neighbours``, on rows in memory."""
        return self._neighbour_k() > 0 and isinstance(data, XCDataset)

    def _n_trees(self, Y: CSR | None = None) -> int:
        """``n_label_trees``: how many label trees the fit builds (None: by the share of
        rare labels in ``Y``, the training labels; 1 without them)."""
        n = _plain(self.n_label_trees)
        if n is None:
            return 1 if Y is None else trees_for(Y.indices, Y.n_cols)
        check_int("n_label_trees", n, 1, MAX_TREES)
        return int(n)

    def _optional_float(self, name: str, high: float) -> float | None:
        """Parameter ``name``: None (left to the fit) or a number in [0, ``high``]."""
        value = _plain(getattr(self, name))
        if value is None:
            return None
        check_float(name, value, 0.0, high)
        return float(value)

    def _recipe(self) -> FusedRecipe:
        """What this fit builds of the fused parts (``neighbours`` must be > 0)."""
        n = _plain(self.n_label_trees)
        return FusedRecipe(
            self._neighbour_k(),
            self._neighbour_mix(),
            self._given_weight(),
            self._given_tail(),
            self._label_centroids(),
            self._label_classifiers(),
            self._label_tree(),
            None if n is None else self._n_trees(),
            self.seed_,
        )

    def _neighbour_split(self, data, seed: int) -> tuple[object, XCDataset | None]:
        """``(rows the network trains on, rows held out to choose the weight on)``; no
        rows are held when the weight is given, the index is off or the rows are few."""
        self.neighbours_, self.neighbour_weight_ = None, self._given_weight()
        self.tail_exponent_ = self._given_tail()
        self._close_fused_parts()
        self._held_rows = None
        for check in (self._neighbour_mix, self._label_tree, self._n_trees):
            check()  # a bad value fails before training, not after it
        n_held = data.n_points - self.n_network_rows(data.n_points)
        if not self._indexes(data):  # streamed: held by where a row is (the stream skips it)
            if self._neighbour_k() > 0:
                self._held_rows = HeldRows.of(n_held, data.n_points, seed)
            return data, None
        return held_split(data, n_held, seed)

    def n_network_rows(self, n_points: int) -> int:
        """How many of ``n_points`` training rows (in memory) a fit trains the network on.

        The others are held out to choose ``neighbour_weight`` and ``tail_exponent`` on
        (when one is None and ``neighbours`` is not 0), then indexed with the rest.

        Parameters
        ----------
        n_points : int
            Rows given to :meth:`fit`.

        Returns
        -------
        int
            The rows the network trains on: ``n_points`` less 5% (at most 2,000), or all
            of them.
        """
        if self._neighbour_k() == 0:
            return n_points
        given = FusedRecipe(1, weight=self._given_weight(), tail=self._given_tail(),
                            centroids=self._label_centroids())  # fmt: skip
        return n_points - given.n_held(n_points)

    def _build_neighbours(self, data) -> None:
        """Index the rows the network trains on (nothing for data not in memory)."""
        if not self._indexes(data):
            return
        recipe = self._recipe()
        self.neighbours_ = recipe.index(data, recipe.classifiers(data))
        self._index_rows, self._embed_step, self._weight_step = data.X, -1, -1
        if self._held is None:  # given, or too few rows to hold out
            self.neighbour_weight_, self.tail_exponent_ = recipe.fallback(self.neighbours_)

    def _finish_neighbours(self, data) -> bool:
        """At the end of a fit: the weight chosen for the final network, then the held
        rows indexed with the others, and the label tree of them all (for rows not in
        memory: all of it built where the model is, from the rows read there); whether
        predictions changed by it."""
        if self.neighbours_ is None and not self._indexes(data) and self._neighbour_k() > 0:
            build = FusedBuild(self._recipe(), self._held_rows)
            client = self._current_client()
            self._fused_parts = build_fused_parts(self.trainer_, data, build, client)
            self.neighbour_weight_, self.tail_exponent_ = self._fused_parts.chosen()
            return True
        if self.neighbours_ is None:
            return False
        chosen = self._choose_weight()
        held, self._held = self._held, None
        net = _EstimatorNetwork(self)
        fused = self._recipe().finish(self.neighbours_, data, held, net, chosen)
        self.neighbours_ = fused.index
        self._index_rows, self._embed_step = None, self._step
        return True

    def _choose_weight(self) -> tuple[tuple[float, ...], float]:
        """The fused weights and tail exponent for the network as it is now (what was
        not given is chosen on the held rows)."""
        if self._held is not None and self._weight_step != self._step:
            chosen = self._recipe().choose(self._index_now(), _EstimatorNetwork(self), self._held)
            self.neighbour_weight_, self.tail_exponent_ = chosen
            self._weight_step = self._step
        if self.neighbour_weight_ is None or self.tail_exponent_ is None:
            raise RuntimeError("the neighbours' weights were never set")  # callers fuse
        return self.neighbour_weight_, self.tail_exponent_

    def _index_now(self) -> NeighbourIndex:
        """The index, with hidden vectors of the network as it is now."""
        index = self.neighbours_
        if index is None:
            raise RuntimeError("the model keeps no neighbour index")  # callers fuse
        rows = getattr(self, "_index_rows", None)
        if rows is not None and self._embed_step != self._step:
            index = self.neighbours_ = index.with_embedding(self.trainer_.embed(rows))
            self._embed_step = self._step
        return index

    def _close_fused_parts(self) -> None:
        """Let go of fused parts built where the model was (a new fit replaces them)."""
        built = self.__dict__.pop("_fused_parts", None)
        if built is not None:
            built.close()

    def fused_model(self) -> FusedModel | None:
        """The fused parts of the fitted model, apart from its network.

        Returns
        -------
        FusedModel or None
            The neighbour index (training rows, their hidden vectors, label classifiers,
            centroids and trees) and the chosen :class:`~dslide_dask.model.fused.Fusion`;
            None when the network answers alone (``neighbours=0``, or a fit that kept
            no rows).
        """
        self._check_fitted()
        built = getattr(self, "_fused_parts", None)
        if built is not None:
            return built.model()
        if getattr(self, "neighbours_", None) is None:
            return None
        return self._fused(*self._choose_weight())

    def _fused(self, weight: tuple[float, ...] | None = None, tail: float = 0.0) -> FusedModel:
        """The fused model as it is now: the index (with hidden vectors of the network as
        it is now) and the fusion ``weight`` (None: every source asked, as while the
        weights are chosen) and ``tail``."""
        fusion = Fusion(
            self._neighbour_k(), self._neighbour_mix(), weight, tail, self._label_tree()
        )
        return FusedModel(self._index_now(), fusion)

    def _candidates(self) -> int:
        return min(CANDIDATES, self.trainer_.n_labels)

    def _fused_topk(self, X: CSR, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ids and fused scores of the network and the neighbours' votes."""
        built = getattr(self, "_fused_parts", None)
        if built is not None:
            return built.topk(X, k, exact)
        weight, tail = self._choose_weight()
        return self._fused(weight, tail).topk(_EstimatorNetwork(self), X, k, exact)

    def _fused_metrics(self, data: XCDataset, ks: tuple[int, ...], exact: bool) -> dict:
        """P@k, nDCG@k and PSP@k of the fused top-k (propensities from the indexed rows:
        every training row, once the fit is over)."""
        built = getattr(self, "_fused_parts", None)
        if built is not None:
            return built.metrics(data, ks, exact)
        weight, tail = self._choose_weight()
        fused, net = self._fused(weight, tail), _EstimatorNetwork(self)
        return metrics_of_sums(fused.metric_sums(net, data.X, data.Y, ks, exact))


class _EstimatorNetwork:
    """The estimator's network as fusion asks it (:class:`~dslide_dask.model.fused.
    Network`): through its output index when one is built."""

    def __init__(self, estimator: NeighboursMixin) -> None:
        self.estimator = estimator

    def topk_scores(self, X: CSR, k: int, exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        return self.estimator._network_topk(X, k, exact)

    def embed(self, X: CSR) -> np.ndarray:
        return self.estimator.trainer_.embed(X)

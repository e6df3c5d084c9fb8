"""The training points a ``SlideClassifier`` keeps to vote beside its network.

``neighbours`` (k) nearest training rows of a query vote for their labels; the votes and
the network's softmax are mixed with ``neighbour_weight``. With the weight left to the
fit (None), a few training rows (5%, at most :data:`HELD_MAX`) are held out of the
network's training, the weight that scores best on them is chosen (again whenever the
network has moved when a prediction is asked mid-fit), and the held rows join the index
at the end of the fit. The index needs the training rows in memory: a fit from a URL or
from Dask collections on a cluster, and ``partial_fit``, use the network alone.
"""

from __future__ import annotations

import numpy as np

from dslide_dask.data.blocks import stack_datasets
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.estimator._inputs import _plain
from dslide_dask.metrics import xc_metrics
from dslide_dask.model.config import check_float, check_int
from dslide_dask.model.neighbours import CANDIDATES, NeighbourIndex, choose_weight, fused_topk

#: Rows held out of the network's training to choose the weight on: 5% of the rows, at
#: most this many (enough to tell weights 0.1 apart); none below HELD_MIN_POINTS rows (under
#: 100 held rows would choose by noise).
HELD_MAX = 2000
HELD_SHARE = 0.05
HELD_MIN_POINTS = 2000
#: The weight when too few rows are there to choose it on.
FALLBACK_WEIGHT = 0.2


class NeighboursMixin:
    """``neighbours_`` (a :class:`NeighbourIndex`, or None) and ``neighbour_weight_``."""

    def _neighbour_k(self) -> int:
        k = _plain(self.neighbours)
        check_int("neighbours", k, 0, 1 << 16)
        return k

    def _given_weight(self) -> float | None:
        weight = _plain(self.neighbour_weight)
        if weight is not None:
            check_float("neighbour_weight", weight, 0.0, 1.0)
        return weight

    def _neighbour_split(self, data, seed: int) -> tuple[object, XCDataset | None]:
        """``(rows the network trains on, rows held out to choose the weight on)``; no
        rows are held when the weight is given, the index is off or the rows are few."""
        self.neighbours_, self.neighbour_weight_ = None, self._given_weight()
        if self._neighbour_k() == 0 or not isinstance(data, XCDataset):
            return data, None
        n_held = data.n_points - self.n_network_rows(data.n_points)
        if n_held == 0:
            return data, None
        order = np.random.default_rng([seed, 0x4E1]).permutation(data.n_points)
        held = data.take(np.sort(order[:n_held]))
        return data.take(np.sort(order[n_held:])), held

    def n_network_rows(self, n_points: int) -> int:
        """How many of ``n_points`` training rows (in memory) a fit trains the network on;
        the others are held out to choose ``neighbour_weight`` on."""
        if self._neighbour_k() == 0 or self._given_weight() is not None:
            return n_points
        if n_points < HELD_MIN_POINTS:
            return n_points
        return n_points - min(HELD_MAX, round(n_points * HELD_SHARE))

    def _build_neighbours(self, data) -> None:
        """Index the rows the network trains on (nothing for data not in memory)."""
        if self._neighbour_k() == 0 or not isinstance(data, XCDataset):
            return
        self.neighbours_ = NeighbourIndex.build(data.X, data.Y)
        self._weight_step = -1
        if self.neighbour_weight_ is None and self._held is None:  # too few rows to hold
            self.neighbour_weight_ = FALLBACK_WEIGHT

    def _finish_neighbours(self, data) -> bool:
        """At the end of a fit: the weight chosen for the final network, then the held
        rows indexed with the others; whether predictions changed by it."""
        if self.neighbours_ is None or self._held is None:
            return False
        self._choose_weight()
        held, self._held = self._held, None
        every = stack_datasets([data, held], data.n_features, data.n_labels)
        self.neighbours_ = NeighbourIndex.build(every.X, every.Y)
        return True

    def _choose_weight(self) -> float:
        """The fused weight for the network as it is now (chosen on the held rows)."""
        if self._held is not None and self._weight_step != self._step:
            held = self._held
            ids, logits = self.trainer_.topk_scores(held.X, self._candidates(), True)
            votes = self.neighbours_.votes(held.X, self._neighbour_k())
            self.neighbour_weight_ = choose_weight(ids, logits, votes, held.Y)
            self._weight_step = self._step
        return self.neighbour_weight_

    def _candidates(self) -> int:
        return min(CANDIDATES, self.trainer_.n_labels)

    def _fused_topk(self, X: CSR, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ids and fused scores of the network and the neighbours' votes."""
        weight = self._choose_weight()
        ids, logits = self.trainer_.topk_scores(X, max(k, self._candidates()), exact)
        votes = self.neighbours_.votes(X, self._neighbour_k(), self._candidates())
        return fused_topk(ids, logits, votes, weight, k)

    def _fused_metrics(self, data: XCDataset, ks: tuple[int, ...], exact: bool) -> dict:
        """P@k, nDCG@k and PSP@k of the fused top-k (propensities from the indexed rows:
        every training row, once the fit is over)."""
        top, _ = self._fused_topk(data.X, max(ks), exact)
        index = self.neighbours_
        counts = np.bincount(index.y_idx, minlength=index.n_labels)
        return xc_metrics(top, data.Y, ks, label_counts=counts, n_train=index.n_points)

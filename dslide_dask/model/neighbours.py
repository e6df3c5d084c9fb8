"""The training points kept beside the network, and how their votes join its scores.

Most labels of an extreme data set have a handful of training points. The network's row
of such a label takes a few Adam steps in a whole fit through a 128-wide bottleneck and
learns little; the points themselves still say a lot: a query close (in the input's
cosine) to a point of label ``l`` is evidence for ``l``. :class:`NeighbourIndex` keeps
the training rows as an inverted index; a query's ``k`` nearest points vote for their
labels. :func:`fused_topk` mixes the network's softmax over its top candidates with those
votes, ``(1 - w) * p + w * share``, and :func:`choose_weight` picks ``w`` on rows the
network did not train on: where the network generalises (Debian: w ~0.2) it keeps the
lead, where labels are too rare for it (amazon-670k: w ~0.7) the neighbours take it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import neighbours as kernels
from dslide_dask.metrics import precision_at_k

#: Weights :func:`choose_weight` tries.
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))
#: Candidates a row takes from each side before fusing.
CANDIDATES = 100
#: The arrays that define an index (what a checkpoint keeps), with their dtypes.
ARRAYS = {
    "post_ptr": np.int64,
    "post_pts": np.int32,
    "post_val": np.float32,
    "y_ptr": np.int64,
    "y_idx": np.int32,
}


@dataclass(frozen=True, eq=False)
class NeighbourIndex:
    """Training rows, L2-normalised, as an inverted index (feature -> points and their
    values, ``post_*``) and their labels (``y_*``, CSR)."""

    post_ptr: np.ndarray
    post_pts: np.ndarray
    post_val: np.ndarray
    y_ptr: np.ndarray
    y_idx: np.ndarray
    n_labels: int

    @classmethod
    def build(cls, X: CSR, Y: CSR) -> NeighbourIndex:
        """The index of the rows of ``X`` with their labels ``Y``."""
        if X.n_rows != Y.n_rows:
            raise ValueError(f"X has {X.n_rows} rows but Y has {Y.n_rows}")
        values = X.values()
        ptr, pts, val = kernels.postings(X.indptr, X.indices, values, X.n_cols)
        return cls(ptr, pts, val, Y.indptr.copy(), Y.indices.copy(), Y.n_cols)

    @property
    def n_points(self) -> int:
        return len(self.y_ptr) - 1

    @property
    def n_features(self) -> int:
        return len(self.post_ptr) - 1

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state().values())

    def votes(self, X: CSR, k: int, m: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``X``: the ``m`` labels its ``k`` nearest points vote for most and
        their share of the vote (ids -1 and share 0 where fewer), best first."""
        if X.n_cols > self.n_features:
            raise ValueError(f"X has {X.n_cols} features, the index {self.n_features}")
        values = X.values()
        q_val = kernels.normalised(X.indptr, values)
        return kernels.neighbour_votes(
            X.indptr,
            X.indices,
            q_val,
            self.post_ptr,
            self.post_pts,
            self.post_val,
            self.y_ptr,
            self.y_idx,
            self.n_labels,
            k,
            1.0,
            m,
        )

    def state(self) -> dict[str, np.ndarray]:
        """The arrays that define the index (:data:`ARRAYS`)."""
        return {name: getattr(self, name) for name in ARRAYS}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], n_labels: int) -> NeighbourIndex:
        """The index :meth:`state` described, checked so no kernel reads out of bounds."""
        index = cls(**{k: np.ascontiguousarray(arrays[k]) for k in ARRAYS}, n_labels=n_labels)
        index._check()
        return index

    def _check(self) -> None:
        for name, dtype in ARRAYS.items():
            a = getattr(self, name)
            if a.dtype != dtype or a.ndim != 1:
                raise ValueError(f"neighbour index: {name} must be 1-D {np.dtype(dtype)}")
        for ptr, idx, name in (
            (self.post_ptr, self.post_pts, "post"),
            (self.y_ptr, self.y_idx, "y"),
        ):
            if len(ptr) == 0 or ptr[0] != 0 or ptr[-1] != len(idx) or (np.diff(ptr) < 0).any():
                raise ValueError(f"neighbour index: {name}_ptr is not a valid row pointer")
        if len(self.post_val) != len(self.post_pts):
            raise ValueError("neighbour index: post_val and post_pts differ in length")
        if (
            len(self.post_pts)
            and not 0 <= self.post_pts.min() <= self.post_pts.max() < self.n_points
        ):
            raise ValueError("neighbour index: a posting names a point out of range")
        if len(self.y_idx) and not 0 <= self.y_idx.min() <= self.y_idx.max() < self.n_labels:
            raise ValueError("neighbour index: a label id is out of range")


def softmax_of_top(logits: np.ndarray) -> np.ndarray:
    """The network's probabilities, the softmax over each row's top logits (-inf: none)."""
    top = np.where(np.isfinite(logits), logits, -np.inf).astype(np.float64)
    top -= np.max(np.where(np.isfinite(top), top, -1e300), axis=1, keepdims=True)
    p = np.exp(top)
    return (p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)).astype(np.float32)


def fused_topk(
    net_ids: np.ndarray,
    net_logits: np.ndarray,
    votes: tuple[np.ndarray, np.ndarray],
    weight: float,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best labels of each row by ``(1 - weight) * p_network + weight * share``,
    and those scores (-inf where fewer than ``k`` labels were found)."""
    return kernels.fuse(net_ids, softmax_of_top(net_logits), votes[0], votes[1], weight, k)


def choose_weight(
    net_ids: np.ndarray, net_logits: np.ndarray, votes: tuple[np.ndarray, np.ndarray], Y: CSR
) -> float:
    """The weight of :data:`WEIGHTS` whose fused top 5 scores best on rows with true
    labels ``Y`` (mean of P@1, P@3, P@5; the smaller weight on a tie)."""
    best, best_score = 0.0, -1.0
    for w in WEIGHTS:
        top, _ = fused_topk(net_ids, net_logits, votes, w, 5)
        score = float(np.mean(list(precision_at_k(top, Y, (1, 3, 5)).values())))
        if score > best_score + 1e-12:
            best, best_score = w, score
    return best

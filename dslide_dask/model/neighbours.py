"""The training points kept beside the network, and how their votes join its scores.

Most labels of an extreme data set have a handful of training points. The network's row
of such a label takes a few Adam steps in a whole fit through a 128-wide bottleneck and
learns little; the points themselves still say a lot: a query close (in the input's
cosine) to a point of label ``l`` is evidence for ``l``. :class:`NeighbourIndex` keeps
the training rows as an inverted index; a query's ``k`` nearest points vote for their
labels. The same holds in the network's own hidden space, and better: the last hidden
layer places rows with the same labels close together even where the output row of a
rare label learned little (debian-files: the points nearest there find the first label
0.776 of the time, the network's output layer 0.689, the inputs' cosine 0.681), so the
index also keeps each point's hidden vector (``embedding``) once the network is trained.

:func:`fused_topk` mixes the network's softmax over its top candidates with both votes,
``(1 - a - b) * p + a * share_input + b * share_hidden``, and :func:`choose_weights`
picks ``(a, b)`` on rows the network did not train on: where the network generalises it
keeps a share, where labels are too rare for it the neighbours take over.

Both sources still favour frequent labels (the softmax learned their priors, and a
frequent label sits among more neighbours), so a label's fused score is multiplied by its
inverse propensity to a power ``tail`` (``p_l ** -tail``, Jain et al.'s propensity from
the training counts, the one PSP@k weighs by): a logit adjustment that lifts rare labels.
Chosen with the weights; on all three sets measured it raised P@1 as well as PSP@k
(docs/accuracy.md).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import neighbours as kernels
from dslide_dask.metrics import propensity
from dslide_dask.model.output_index import IndexSettings
from dslide_dask.model.point_search import PointSearch

#: Weights (input neighbours, hidden neighbours) :func:`choose_weights` tries: a 0.1 grid
#: over the triangle a + b <= 1 (the network gets the rest).
WEIGHTS = tuple((round(0.1 * a, 1), round(0.1 * b, 1)) for a in range(11) for b in range(11 - a))
#: Exponents of the inverse propensity :func:`choose_weights` tries (0: no tail boost).
TAILS = (0.0, 0.1, 0.2, 0.3, 0.4)
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
#: The optional array: each point's hidden vector (L2-normalised), one row a point.
EMBEDDING = "embedding"
#: Query rows scored against every point's hidden vector at once (a BLAS product).
EMBED_BLOCK = 1024


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
    embedding: np.ndarray | None = None
    #: An approximate search over :attr:`embedding` (:meth:`with_search`), or None: every
    #: point is scored. Derived from the vectors, never stored.
    search: PointSearch | None = dataclasses.field(default=None, repr=False)
    #: The postings a served row reads (:meth:`with_serving_postings`): these, less the
    #: features most points hold, as ``(ptr, pts, val)``; None: all. Never stored.
    serving: tuple[np.ndarray, np.ndarray, np.ndarray] | None = dataclasses.field(
        default=None, repr=False
    )

    @classmethod
    def build(cls, X: CSR, Y: CSR) -> NeighbourIndex:
        """The index of the rows of ``X`` with their labels ``Y``."""
        if X.n_rows != Y.n_rows:
            raise ValueError(f"X has {X.n_rows} rows but Y has {Y.n_rows}")
        values = X.values()
        ptr, pts, val = kernels.postings(X.indptr, X.indices, values, X.n_cols)
        return cls(ptr, pts, val, Y.indptr.copy(), Y.indices.copy(), Y.n_cols)

    def with_embedding(self, hidden: np.ndarray) -> NeighbourIndex:
        """This index with each point's hidden vector (``(n_points, width)``)."""
        hidden = np.asarray(hidden, np.float32)
        if hidden.ndim != 2 or hidden.shape[0] != self.n_points:
            raise ValueError(f"expected {self.n_points} hidden vectors, got {hidden.shape}")
        return dataclasses.replace(self, embedding=_unit_rows(hidden), search=None)

    def with_search(self, settings: IndexSettings | None = None) -> NeighbourIndex:
        """This index with an approximate search over its hidden vectors
        (:class:`~dslide_dask.model.point_search.PointSearch`; needs faiss), so a row's
        hidden-space votes score the points it proposes, not every point."""
        if self.embedding is None:
            raise ValueError("the neighbour index has no hidden vectors to search")
        return dataclasses.replace(self, search=PointSearch.build(self.embedding, settings))

    @property
    def n_points(self) -> int:
        return len(self.y_ptr) - 1

    @property
    def n_features(self) -> int:
        return len(self.post_ptr) - 1

    @functools.cached_property
    def label_counts(self) -> np.ndarray:
        """How many indexed points carry each label."""
        return np.bincount(self.y_idx, minlength=self.n_labels)

    @functools.cached_property
    def inverse_propensity(self) -> np.ndarray:
        """Each label's ``1 / p_l`` from :attr:`label_counts` (>= 1; rare labels highest)."""
        return (1.0 / propensity(self.label_counts, max(self.n_points, 1))).astype(np.float32)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state().values())

    def votes(self, X: CSR, k: int, m: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``X``: the ``m`` labels its ``k`` nearest points vote for most and
        their share of the vote (ids -1 and share 0 where fewer), best first (from the
        serving postings once set: :meth:`with_serving_postings`)."""
        if X.n_cols > self.n_features:
            raise ValueError(f"X has {X.n_cols} features, the index {self.n_features}")
        values = X.values()
        q_val = kernels.normalised(X.indptr, values)
        ptr, pts, val = self.serving or (self.post_ptr, self.post_pts, self.post_val)
        return kernels.neighbour_votes(
            X.indptr,
            X.indices,
            q_val,
            ptr,
            pts,
            val,
            self.y_ptr,
            self.y_idx,
            self.n_labels,
            k,
            1.0,
            m,
        )

    def with_serving_postings(self, max_share: float) -> NeighbourIndex:
        """This index answering from its postings less those of the features held by
        more than ``max_share`` of the points (a row's common words reach nearly every
        point, so the nearest points cost a pass over all of them, while their small
        values barely move which points are nearest: ``docs/serving.md``)."""
        lengths = np.diff(self.post_ptr)
        keep = lengths <= max_share * self.n_points
        ptr = np.concatenate([[0], np.cumsum(np.where(keep, lengths, 0))]).astype(np.int64)
        held = np.repeat(keep, lengths)
        return dataclasses.replace(self, serving=(ptr, self.post_pts[held], self.post_val[held]))

    def embedding_votes(
        self, hidden: np.ndarray, k: int, m: int = CANDIDATES
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`votes` of the points nearest each row's hidden vector (cosine): every
        point scored, or those the search proposes (:meth:`with_search`)."""
        if self.embedding is None:
            raise ValueError("the neighbour index has no hidden vectors")
        query = _unit_rows(np.asarray(hidden, np.float32))
        if query.shape[1:] != self.embedding.shape[1:]:
            raise ValueError(f"hidden vectors of width {query.shape[1:]}, the index {self.width}")
        if self.search is not None:
            found = self.search.candidates(query, max(self.search.settings.candidates, k))
            return kernels.candidate_neighbour_votes(
                query, self.embedding, found, self.y_ptr, self.y_idx, self.n_labels, k, m
            )
        parts = [np.full((0, m), -1, np.int64)], [np.zeros((0, m), np.float32)]
        for start in range(0, query.shape[0], EMBED_BLOCK):
            sims = query[start : start + EMBED_BLOCK] @ self.embedding.T
            ids, shares = kernels.dense_neighbour_votes(
                sims, self.y_ptr, self.y_idx, self.n_labels, k, m
            )
            parts[0].append(ids)
            parts[1].append(shares)
        return np.concatenate(parts[0]), np.concatenate(parts[1])

    @property
    def width(self) -> int | None:
        return None if self.embedding is None else self.embedding.shape[1]

    def state(self) -> dict[str, np.ndarray]:
        """The arrays that define the index (:data:`ARRAYS`, and :data:`EMBEDDING` once
        it has hidden vectors)."""
        out = {name: getattr(self, name) for name in ARRAYS}
        if self.embedding is not None:
            out[EMBEDDING] = self.embedding
        return out

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], n_labels: int) -> NeighbourIndex:
        """The index :meth:`state` described, checked so no kernel reads out of bounds."""
        kept: dict[str, Any] = {k: np.ascontiguousarray(arrays[k]) for k in ARRAYS}
        index = cls(**kept, n_labels=n_labels)
        index._check()
        if EMBEDDING in arrays:
            hidden = arrays[EMBEDDING]
            if hidden.dtype != np.float32 or hidden.ndim != 2 or len(hidden) != index.n_points:
                raise ValueError(
                    f"neighbour index: {EMBEDDING} must be float32 of {index.n_points} rows"
                )
            if not np.isfinite(hidden).all():
                raise ValueError(f"neighbour index: {EMBEDDING} holds a NaN or infinity")
            index = dataclasses.replace(index, embedding=np.ascontiguousarray(hidden))
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
    votes: list[tuple[np.ndarray, np.ndarray]],
    weights: tuple[float, ...],
    k: int,
    tail: float = 0.0,
    inverse_propensity: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best labels of each row by ``((1 - sum(weights)) * p_network + sum of
    weights[i] * share_i) * inverse_propensity ** tail`` over the votes given (weights
    past them ignored), and those scores (-inf where fewer than ``k`` labels were found)."""
    ids, scores = _stacked(net_ids, net_logits, votes)
    if tail:
        if inverse_propensity is None:
            raise ValueError("a tail boost needs the labels' inverse propensities")
        _boost(ids, scores, inverse_propensity, tail)
    return kernels.fuse(ids, scores, _source_weights(weights[: len(votes)]), k)


def choose_weights(
    net_ids: np.ndarray,
    net_logits: np.ndarray,
    votes: list[tuple[np.ndarray, np.ndarray]],
    Y: CSR,
    inverse_propensity: np.ndarray | None = None,
    weights: tuple[float, float] | None = None,
    tail: float | None = None,
) -> tuple[tuple[float, float], float]:
    """The weights of :data:`WEIGHTS` (input, hidden; the hidden one 0 when only the
    input's votes are given) and the tail exponent of :data:`TAILS` (0 without
    ``inverse_propensity``) whose fused top 5 scores best on rows with true labels ``Y``
    (mean of P@1, P@3, P@5; the first tried on a tie, smaller exponents first).
    ``weights`` or ``tail`` given: only that one is tried."""
    labels, values = _union(*_stacked(net_ids, net_logits, votes))
    found = labels >= 0
    hits = np.where(found, _hits(labels, Y), -1).astype(np.int8)
    pairs = WEIGHTS if weights is None else (weights,)
    tails = (tail,) if tail is not None else TAILS if inverse_propensity is not None else (0.0,)
    best, best_score = (pairs[0], tails[0]), -1.0
    for exponent in tails:
        boosted = values
        if exponent:
            if inverse_propensity is None:
                raise ValueError("a tail boost needs the labels' inverse propensities")
            factor = inverse_propensity[np.where(found, labels, 0)] ** np.float32(exponent)
            boosted = values * factor
        for pair in pairs:
            if len(votes) < 2 and pair[1] > 0 and weights is None:
                continue
            w = _source_weights(pair[: len(votes)])
            score = _mean_precision(kernels.hits_by_rank(boosted, hits, w, 5), len(labels))
            if score > best_score + 1e-12:
                best, best_score = (pair, exponent), score
    return best


def _union(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's candidates over all sources, once: ``(n, width)`` label ids (-1 past
    a row's) and ``(sources, n, width)`` each source's score of them (0 where it did not
    list the label). Weighing the sources is then one product per weight tried, where
    :func:`~dslide_dask.kernels.neighbours.fuse` would gather and sort again."""
    n_sources, n, m = ids.shape
    flat = ids.transpose(1, 0, 2).reshape(n, n_sources * m)
    order = np.argsort(flat, axis=1, kind="stable")
    sorted_ids = np.take_along_axis(flat, order, 1)
    new = np.ones(sorted_ids.shape, bool)
    new[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    new &= sorted_ids >= 0
    slot = np.cumsum(new, axis=1) - 1  # the union slot of each sorted entry
    labels = np.full(flat.shape, -1, np.int64)
    rows = np.broadcast_to(np.arange(n)[:, None], flat.shape)
    labels[rows[new], slot[new]] = sorted_ids[new]
    values = np.zeros((n_sources, *flat.shape), np.float32)
    source = order // m  # the entry's source, in the row's flattened order
    keep = sorted_ids >= 0
    flat_scores = scores.transpose(1, 0, 2).reshape(n, n_sources * m)
    np.add.at(
        values,
        (source[keep], rows[keep], slot[keep]),
        np.take_along_axis(flat_scores, order, 1)[keep],
    )
    return labels, values


def _hits(labels: np.ndarray, Y: CSR) -> np.ndarray:
    """Whether each ``labels[i, j]`` is one of row ``i``'s labels in ``Y``."""
    width = np.int64(Y.n_cols) + 1
    truth = np.repeat(np.arange(Y.n_rows, dtype=np.int64), np.diff(Y.indptr)) * width
    keys = np.arange(labels.shape[0], dtype=np.int64)[:, None] * width + labels
    return np.isin(keys, truth + Y.indices)


def _mean_precision(hits_by_rank: np.ndarray, n_rows: int) -> float:
    """Mean of P@1, P@3 and P@5 from the rows' right labels at each rank of their top 5."""
    got = np.cumsum(hits_by_rank)
    return float(np.mean([got[k - 1] / (k * max(n_rows, 1)) for k in (1, 3, 5)]))


def _stacked(
    net_ids: np.ndarray, net_logits: np.ndarray, votes: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The network's softmax and each list of votes as one ``(sources, rows, m)`` array
    of ids (-1: none) and one of scores, for :func:`~dslide_dask.kernels.neighbours.fuse`."""
    lists = [(net_ids, softmax_of_top(net_logits)), *votes]
    n, m = net_ids.shape[0], max(ids.shape[1] for ids, _ in lists)
    ids = np.full((len(lists), n, m), -1, np.int64)
    scores = np.zeros((len(lists), n, m), np.float32)
    for s, (i, v) in enumerate(lists):
        ids[s, :, : i.shape[1]] = i
        scores[s, :, : v.shape[1]] = v
    return ids, scores


def _boost(ids: np.ndarray, scores: np.ndarray, inverse_propensity: np.ndarray, tail: float):
    """Multiply each candidate's score by its label's ``inverse_propensity ** tail`` (in
    place): fusing is linear, so boosting every source's score boosts the sum."""
    found = ids >= 0
    scores[found] *= inverse_propensity[ids[found]] ** np.float32(tail)


def _source_weights(weights: tuple[float, ...]) -> np.ndarray:
    """The network's weight (the rest of 1) before the votes' own."""
    return np.array([1.0 - sum(weights), *weights], np.float32)


def _unit_rows(a: np.ndarray) -> np.ndarray:
    """``a`` with each row scaled to unit L2 norm (an all-zero row stays zero)."""
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return np.ascontiguousarray(a / np.where(norms > 0, norms, 1), np.float32)

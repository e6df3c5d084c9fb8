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
Points close in both spaces are likelier still: the hidden-space neighbours can be
chosen by ``(1 - mix) * cos_hidden + mix * cos_input`` (:meth:`NeighbourIndex.embedding_votes`).

The index also carries the frequent labels' own linear classifiers
(:mod:`.label_classifiers`), trained on the same rows, every label's centroid
(:mod:`.label_centroids`), derived from them, and a label tree (:mod:`.label_tree`)
that re-ranks the fused candidates.

How their votes join the network's scores is :mod:`.fusion`'s. Over 400 lines: every
source reads the same normalised query and the sources are saved, and checked on load,
as one set of arrays; each source's arithmetic lives in its own module.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import hidden_votes
from dslide_dask.kernels import neighbours as kernels
from dslide_dask.metrics import propensity
from dslide_dask.model import label_classifiers, label_tree, tree_serving, tree_shards
from dslide_dask.model.config import check_int
from dslide_dask.model.label_centroids import LabelCentroids
from dslide_dask.model.label_classifiers import LabelClassifiers
from dslide_dask.model.label_tree import LabelTree, build_forest
from dslide_dask.model.output_index import IndexSettings
from dslide_dask.model.point_search import PointSearch
from dslide_dask.model.row_chunks import row_chunks
from dslide_dask.model.tree_nodes import NodeTrainer

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
#: The optional label classifiers' arrays, by their names in a checkpoint.
CLASSIFIER_ARRAYS = {f"classifier_{name}": name for name in label_classifiers.ARRAYS}
#: The most label trees an index holds (:meth:`NeighbourIndex.with_built_trees`).
MAX_TREES = 8
#: Each optional label tree's arrays, by their names in a checkpoint: ``tree_perm``...,
#: then ``tree2_perm``...
TREE_ARRAYS = [
    {f"tree{t + 1 if t else ''}_{name}": name for name in label_tree.ARRAYS}
    for t in range(MAX_TREES)
]
#: Query rows scored against every point's hidden vector at once (a BLAS product), at
#: most: fewer where their similarities would pass EMBED_BYTES (the held rows of
#: ``amazon-3m``'s 300K points took 2.4 GB at 1,024 rows a block, the build's peak).
EMBED_BLOCK = 1024
EMBED_BYTES = 1 << 28
#: No common features: the votes through every posting need none.
_NO_COMMON = (np.zeros(0, np.int32), np.zeros((0, 0), np.float32))
#: Points a served row's postings propose, scored exactly
#: (:meth:`NeighbourIndex.with_serving_postings`).
RESCORED = 64


@dataclass(frozen=True, eq=False)
class ServedPostings:
    """What a served row reads: the postings less the common features' (``postings``:
    ptr, points, values); each point's values of the common features, dense (``common``,
    a column a feature, ``common_slot``: a feature's column, -1 for the others), which
    complete the exact cosine of the ``rescored`` points the postings propose; and every
    training row, normalised, in CSR (``rows``: ptr, features, values) for the exact
    cosine of any point (:func:`~dslide_dask.kernels.neighbours.row_cosines`)."""

    postings: tuple[np.ndarray, np.ndarray, np.ndarray]
    common_slot: np.ndarray
    common: np.ndarray
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]
    rescored: int


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
    #: The frequent labels' linear classifiers (:meth:`with_classifiers`), or None.
    classifiers: LabelClassifiers | None = None
    #: An approximate search over :attr:`embedding` (:meth:`with_search`), or None: every
    #: point is scored. Derived from the vectors, never stored.
    search: PointSearch | None = dataclasses.field(default=None, repr=False)
    #: What a served row reads (:meth:`with_serving_postings`), or None: every posting.
    #: Derived from the postings, never stored.
    serving: ServedPostings | None = dataclasses.field(default=None, repr=False)
    #: Each label's centroid (:meth:`with_centroids`), or None. Derived, never stored.
    centroids: LabelCentroids | None = dataclasses.field(default=None, repr=False)
    #: Label trees (:meth:`with_trees`): a candidate's loss is its mean over them.
    trees: tuple[LabelTree, ...] = dataclasses.field(default=(), repr=False)

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

    def with_classifiers(self, classifiers: LabelClassifiers | None) -> NeighbourIndex:
        """This index with the frequent labels' classifiers (None: without)."""
        if classifiers is not None and classifiers.labels.max() >= self.n_labels:
            raise ValueError("the classifiers name a label the index does not have")
        return dataclasses.replace(self, classifiers=classifiers)

    def classifier_votes(self, X: CSR, m: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``X``: the ``m`` labels the classifiers score highest, and those
        scores (none without classifiers: empty lists)."""
        if self.classifiers is None:
            return np.full((X.n_rows, 0), -1, np.int64), np.zeros((X.n_rows, 0), np.float32)
        return self.classifiers.top(*self._query(X), m)

    def with_centroids(self) -> NeighbourIndex:
        """This index with each label's centroid of its points (:class:`LabelCentroids`)."""
        if self.centroids is not None:
            return self
        return dataclasses.replace(self, centroids=self._centroids(self._rows()))

    def with_built_trees(
        self, seed: int, n_trees: int = 1, nodes: NodeTrainer | None = None
    ) -> NeighbourIndex:
        """This index with ``n_trees`` label trees of its points, split over their labels'
        centroids from different seeds (:class:`LabelTree`; ``nodes`` trains their
        classifiers, None: here). Single trees differ by 0.002-0.005 in P@1 with the
        seed; the label-tree libraries average three."""
        check_int("n_trees", n_trees, 1, MAX_TREES)
        rows = self._rows()
        centroids = self.centroids if self.centroids is not None else self._centroids(rows)
        seeds = [seed + (t << 20) for t in range(n_trees)]
        trees = build_forest(rows, self.y_ptr, self.y_idx, centroids, seeds, nodes)
        return dataclasses.replace(self, trees=trees)

    def _rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The points' normalised rows (CSR: ptr, features, values), from the postings."""
        return kernels.transpose(self.post_ptr, self.post_pts, self.post_val, self.n_points)

    def _centroids(self, rows: tuple[np.ndarray, np.ndarray, np.ndarray]) -> LabelCentroids:
        return LabelCentroids.build(rows, self.y_ptr, self.y_idx, self.n_labels, self.n_features)

    def with_trees(self, trees: tuple[LabelTree, ...]) -> NeighbourIndex:
        """This index with label trees (none: without)."""
        if len(trees) > MAX_TREES:
            raise ValueError(f"an index holds at most {MAX_TREES} label trees")
        if any(int(tree.perm.max(initial=-1)) >= self.n_labels for tree in trees):
            raise ValueError("a label tree has other labels than the index")
        return dataclasses.replace(self, trees=tuple(trees))

    def tree_losses(self, X: CSR, ids: np.ndarray) -> np.ndarray:
        """Each row's candidates' ``ids`` (-1: none) path losses, the mean over the
        label trees."""
        if not self.trees:
            raise ValueError("the neighbour index has no label tree")
        return tree_shards.mean_losses(self.trees, self._query(X), ids)

    def tree_search(self, X: CSR, beam: int, top: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``top`` labels of least mean path loss among those of its ``beam``
        best leaf nodes in any label tree (:meth:`LabelTree.searched`), and those losses
        (-1 and ``inf`` past a row's last): the trees' own candidates."""
        if not self.trees:
            raise ValueError("the neighbour index has no label tree")
        query = self._query(X)
        found = np.concatenate([tree.searched(query, beam) for tree in self.trees], axis=1)
        found = _distinct(found)
        losses = np.where(found >= 0, tree_shards.mean_losses(self.trees, query, found), np.inf)
        order = np.argsort(losses, axis=1, kind="stable")[:, :top]
        return np.take_along_axis(found, order, 1), np.take_along_axis(losses, order, 1)

    def tree_topk_losses(
        self, X: CSR, ids: np.ndarray, scores: np.ndarray, power: float, k: int
    ) -> np.ndarray:
        """:meth:`tree_losses` of the candidates that can be among each row's ``k`` best
        by ``scores * exp(-power * loss)``, ``inf`` for the others
        (:func:`~dslide_dask.model.tree_serving.forest_topk_losses`)."""
        if not self.trees:
            raise ValueError("the neighbour index has no label tree")
        return tree_serving.forest_topk_losses(self.trees, self._query(X), ids, scores, power, k)

    def centroid_votes(self, X: CSR, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's candidates ``ids`` (-1: none) and their centroids' cosine with it."""
        if self.centroids is None:
            raise ValueError("the neighbour index has no label centroids")
        return ids, self.centroids.cosines(self._query(X), ids)

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
    def by_frequency(self) -> np.ndarray:
        """The labels, those most indexed points carry first (ties by id): what a row
        with no other evidence most likely has."""
        return np.argsort(-self.label_counts, kind="stable")

    @functools.cached_property
    def propensities(self) -> np.ndarray:
        """Each label's propensity ``p_l`` from :attr:`label_counts` (PSP@k's)."""
        return propensity(self.label_counts, max(self.n_points, 1))

    @functools.cached_property
    def inverse_propensity(self) -> np.ndarray:
        """Each label's ``1 / p_l`` (>= 1; rare labels highest), as the tail boost takes it."""
        return (1.0 / self.propensities).astype(np.float32)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state().values())

    def votes(self, X: CSR, k: int, m: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``X``: the ``m`` labels its ``k`` nearest points vote for most and
        their share of the vote (ids -1 and share 0 where fewer), best first (from the
        serving postings once set: :meth:`with_serving_postings`)."""
        ids, shares, _ = self.votes_and_points(X, k, m)
        return ids, shares

    def votes_and_points(
        self, X: CSR, k: int, m: int = CANDIDATES
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`votes`, and the ``k`` nearest points themselves (-1 where fewer)."""
        query = self._query(X)
        served = self.serving
        if served is None:
            postings = self.post_ptr, self.post_pts, self.post_val
            slot, common, n_cand = *_NO_COMMON, 0
        else:
            postings, slot, common = served.postings, served.common_slot, served.common
            n_cand = max(k, served.rescored)
        return kernels.neighbour_votes(
            *query,
            *postings,
            slot,
            common,
            self.y_ptr,
            self.y_idx,
            k,
            m,
            n_cand,
            row_chunks(X.n_rows),
        )

    def with_serving_postings(self, max_share: float, rescored: int = RESCORED) -> NeighbourIndex:
        """This index answering from its postings less those of the features held by
        more than ``max_share`` of the points, the ``rescored`` points they find most
        similar scored exactly (a row's common words reach nearly every point, so the
        nearest points cost a pass over all of them, while their small values barely move
        which points are nearest: ``docs/serving.md``). Their sums over the postings are
        completed by the common features' values, kept dense: at most ``1 / max_share``
        times a row's mean entries of them a point (55 features at 670K labels, 11 MB
        for 50K points)."""
        lengths = np.diff(self.post_ptr)
        keep = lengths <= max_share * self.n_points
        ptr = np.concatenate([[0], np.cumsum(np.where(keep, lengths, 0))]).astype(np.int64)
        held = np.repeat(keep, lengths)
        slot = np.full(self.n_features, -1, np.int32)
        slot[~keep] = np.arange(int((~keep).sum()), dtype=np.int32)
        common = np.zeros((self.n_points, int((~keep).sum())), np.float32)
        common[self.post_pts[~held], np.repeat(slot, lengths)[~held]] = self.post_val[~held]
        rows = kernels.transpose(self.post_ptr, self.post_pts, self.post_val, self.n_points)
        postings = (ptr, self.post_pts[held], self.post_val[held])
        served = ServedPostings(postings, slot, common, rows, rescored)
        return dataclasses.replace(self, serving=served)

    def embedding_votes(
        self,
        hidden: np.ndarray,
        k: int,
        m: int = CANDIDATES,
        X: CSR | None = None,
        mix: float = 0.0,
        near: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`votes` of the points nearest each row's hidden vector (cosine): every
        point scored, or those the search proposes (:meth:`with_search`) and the points
        ``near[i]`` (-1: none). With ``mix`` > 0, nearest by ``(1 - mix) * cos_hidden +
        mix * cos_input`` of the rows ``X`` (their exact input cosine): a point the
        search's cells miss may then still be nearest, for its input, so ``near`` takes
        the input's nearest (:meth:`votes_and_points`)."""
        if self.embedding is None:
            raise ValueError("the neighbour index has no hidden vectors")
        query = _unit_rows(np.asarray(hidden, np.float32))
        if query.shape[1:] != self.embedding.shape[1:]:
            raise ValueError(f"hidden vectors of width {query.shape[1:]}, the index {self.width}")
        mixed = None
        if mix > 0:
            if X is None or X.n_rows != len(query):
                raise ValueError("mixing in the input's cosine needs the input rows of the queries")
            mixed = self._query(X)
        if self.search is not None:
            found = self.search.candidates(query, max(self.search.settings.candidates, k))
            if near is not None:
                found = _distinct(np.concatenate([found, near], axis=1))
            other = self._input_cosines(mixed, found)
            return hidden_votes.candidate_neighbour_votes(
                query,
                self.embedding,
                found,
                self.y_ptr,
                self.y_idx,
                k,
                m,
                other,
                mix,
                row_chunks(),
            )
        return self._dense_votes(query, k, m, mixed, mix)[0]

    def mixed_votes(
        self, hidden: np.ndarray, k: int, m: int, X: CSR, mix: float
    ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """:meth:`votes` and :meth:`embedding_votes` with ``mix`` > 0 of rows ``X``, from
        one sum of their input cosines with every point (1.2 s of 12,830 rows against
        50,846 points), for an index that scores every point through every posting
        (neither :meth:`with_search` nor :meth:`with_serving_postings`)."""
        if self.search is not None or self.serving is not None or not mix > 0:
            raise ValueError("mixed votes need every point scored and a mix above 0")
        if X.n_rows != len(hidden):
            raise ValueError("mixing in the input's cosine needs the input rows of the queries")
        if self.embedding is None:
            raise ValueError("the neighbour index has no hidden vectors")
        query = _unit_rows(np.asarray(hidden, np.float32))
        if query.shape[1:] != self.embedding.shape[1:]:
            raise ValueError(f"hidden vectors of width {query.shape[1:]}, the index {self.width}")
        hidden_votes, input_votes = self._dense_votes(query, k, m, self._query(X), mix, k)
        return input_votes, hidden_votes

    def _dense_votes(self, query, k, m, mixed, mix, k_input: int = 0):
        """The hidden votes of unit ``query`` rows scored against every point, in blocks
        of at most :data:`EMBED_BYTES`, the input cosines of the ``mixed`` rows mixed in;
        with ``k_input`` > 0, the input's votes too (from the same cosines)."""
        assert self.embedding is not None
        empty = [np.full((0, m), -1, np.int64)], [np.zeros((0, m), np.float32)]
        parts, inputs = (empty[0][:], empty[1][:]), (empty[0][:], empty[1][:])
        block = max(1, min(EMBED_BLOCK, EMBED_BYTES // (4 * max(1, self.n_points))))
        for start in range(0, query.shape[0], block):
            stop = min(start + block, query.shape[0])
            if mixed is None:
                sims = query[start:stop] @ self.embedding.T
            else:  # (1 - mix) on the few query rows, not the block of similarities
                sims = (query[start:stop] * np.float32(1.0 - mix)) @ self.embedding.T
                q_ptr, q_idx, q_val = mixed
                postings = self.post_ptr, self.post_pts, self.post_val
                labels = self.y_ptr, self.y_idx
                got = hidden_votes.add_cosines(q_ptr[start : stop + 1], q_idx, q_val,
                                               *postings, sims, mix, *labels, k_input, m,
                                               row_chunks())  # fmt: skip
                inputs[0].append(got[0])
                inputs[1].append(got[1])
            ids, shares = hidden_votes.dense_neighbour_votes(
                sims, self.y_ptr, self.y_idx, k, m, row_chunks()
            )
            parts[0].append(ids)
            parts[1].append(shares)
            del sims  # before the next block's are made
        joined = (np.concatenate(parts[0]), np.concatenate(parts[1]))
        return joined, (np.concatenate(inputs[0]), np.concatenate(inputs[1]))

    def _query(self, X: CSR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``X`` in CSR with normalised values."""
        if X.n_cols > self.n_features:
            raise ValueError(f"X has {X.n_cols} features, the index {self.n_features}")
        return X.indptr, X.indices, kernels.normalised(X.indptr, X.values())

    def _input_cosines(
        self, query: tuple[np.ndarray, np.ndarray, np.ndarray] | None, found: np.ndarray
    ) -> np.ndarray:
        """The input cosine of each query row (:meth:`_query`; None: zeros) and the
        points ``found[i]``: from the points' rows once served, else the postings."""
        if query is None:
            return np.zeros(found.shape, np.float32)
        if self.serving is not None:
            return kernels.row_cosines(
                *query, *self.serving.rows, found, self.n_features, row_chunks()
            )
        postings = self.post_ptr, self.post_pts, self.post_val
        return kernels.candidate_cosines(*query, *postings, self.n_points, found, row_chunks())

    @property
    def width(self) -> int | None:
        return None if self.embedding is None else self.embedding.shape[1]

    def state(self) -> dict[str, np.ndarray]:
        """The arrays that define the index (:data:`ARRAYS`, and :data:`EMBEDDING` once
        it has hidden vectors)."""
        out = {name: getattr(self, name) for name in ARRAYS}
        if self.embedding is not None:
            out[EMBEDDING] = self.embedding
        parts = [(self.classifiers, CLASSIFIER_ARRAYS), *zip(self.trees, TREE_ARRAYS, strict=False)]
        for part, names in parts:
            if part is not None:
                kept = part.state()
                out.update({key: kept[name] for key, name in names.items()})
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
        classifiers = _part(
            arrays,
            CLASSIFIER_ARRAYS,
            "classifier",
            lambda a: LabelClassifiers.from_state(a, n_labels),
        )
        if classifiers is not None:
            if classifiers.n_features != index.n_features:
                raise ValueError("neighbour index: the classifiers have other features")
            index = index.with_classifiers(classifiers)
        n_features = index.n_features
        build = lambda a: LabelTree.from_state(a, n_labels, n_features)  # noqa: E731
        found = [_part(arrays, names, "label tree", build) for names in TREE_ARRAYS]
        n = next((t for t, tree in enumerate(found) if tree is None), len(found))
        if any(tree is not None for tree in found[n:]):
            raise ValueError(f"neighbour index: label tree {n + 1} is missing")
        return index.with_trees(tuple(found[:n]))

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


def _part(arrays: dict[str, np.ndarray], names: dict[str, str], what: str, build):
    """The optional part saved under ``names`` (checkpoint name -> its own), built from
    its arrays by ``build``; None if none is saved; ValueError naming ``what`` if only
    some are, or if ``build`` finds them damaged."""
    present = [key for key in names if key in arrays]
    if not present:
        return None
    if len(present) != len(names):
        raise ValueError(f"neighbour index: {what} arrays {sorted(names)}")
    try:
        return build({name: arrays[key] for key, name in names.items()})
    except ValueError as err:
        raise ValueError(f"neighbour index: {what}: {err}") from None


def _unit_rows(a: np.ndarray) -> np.ndarray:
    """``a`` with each row scaled to unit L2 norm (an all-zero row stays zero)."""
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return np.ascontiguousarray(a / np.where(norms > 0, norms, 1), np.float32)


def _distinct(candidates: np.ndarray) -> np.ndarray:
    """Each row's point ids once (sorted; -1 for a repeat or a none)."""
    out = np.sort(candidates, axis=1)
    out[:, 1:][out[:, 1:] == out[:, :-1]] = -1
    return out

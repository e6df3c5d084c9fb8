"""A label tree, as the label-tree libraries build one, scoring the candidates others found.

Where a label has a handful of training rows, the network and the neighbours' votes rank
it by how alike its rows and the query are; omikuji and PECOS ranked better, and 95% of
their right first labels were among our candidates (docs/accuracy.md). What they add is
discrimination: each label has a classifier trained against the labels most like it, and
each cluster of labels one against the clusters most like it. This is that tree:

- Labels are split in halves, recursively, by a balanced spherical 2-means over their
  centroids (:class:`~dslide_dask.model.label_centroids.LabelCentroids`), until a leaf has
  at most :data:`LEAF` labels.
- Classifier nodes sit every :data:`SPAN` halvings from the leaves up, and at the root:
  each trains a classifier per child (a node :data:`SPAN` halvings down, or a label at a
  leaf) on its own rows, those with a label under it. That is the root over every row, a
  leaf over a few hundred.
- A candidate's score is the likelihood of its path, ``exp(-sum of the squared hinge
  losses of the classifiers on it)``: the fused score is multiplied by its power
  ``label_tree``. Only the candidates are scored, so there is no beam to search.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.kernels import label_tree as kernels
from dslide_dask.kernels import tree_inner, tree_query, tree_search
from dslide_dask.kernels.neighbours import transpose
from dslide_dask.model.label_centroids import LabelCentroids
from dslide_dask.model.row_chunks import row_chunks
from dslide_dask.model.tree_nodes import NodeProblem, NodeTrainer, joined, train_levels

#: A leaf holds at most this many labels (Parabel's and omikuji's 100).
LEAF = 100
#: Halvings between two classifier nodes: a node has at most 2**SPAN children (64).
SPAN = 6
#: Rounds of the balanced 2-means at each split.
ITERATIONS = 6
#: Training labels are :func:`mostly_rare` where labels of at most RARE_ROWS training rows
#: hold at least RARE_SHARE of them: a fit left to it then builds two trees
#: (:func:`trees_for`) and draws fewer negatives (``config.MIN_ACTIVE_RARE``).
RARE_ROWS, RARE_SHARE = 3, 1 / 3
#: Leaf nodes a tree's own search opens for a row (:meth:`LabelTree.searched`): on
#: debian-files-rare with its label rows, its P@1 alone was 0.307 at 3, 0.310 at 10 and
#: 0.309 for a scan of every label (docs/accuracy.md, ninth look).
SEARCH_BEAM = 10
#: The arrays that define a tree (:meth:`LabelTree.state`).
ARRAYS = ("perm", "bounds", "level_ptr", "child_ptr", "w_ptr", "w_feature", "w_val", "bias")

#: The arrays not of int64.
DTYPES: dict[str, type] = {"w_feature": np.int32, "w_val": np.float32, "bias": np.float32}


@dataclass(frozen=True, eq=False)
class LabelTree:
    """Labels in tree order ``perm``; classifier level ``v``'s nodes begin at positions
    ``bounds[level_ptr[v]:level_ptr[v+1]]`` (the last entry: the end); node ``n``
    (numbered level by level) has the children ``child_ptr[n]:child_ptr[n+1]``, and child
    ``c`` the weights ``w_feature/w_val[w_ptr[c]:w_ptr[c+1]]`` (features ascending) and
    the bias ``bias[c]``."""

    perm: np.ndarray
    bounds: np.ndarray
    level_ptr: np.ndarray
    child_ptr: np.ndarray
    w_ptr: np.ndarray
    w_feature: np.ndarray
    w_val: np.ndarray
    bias: np.ndarray

    @classmethod
    def build(
        cls,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray],
        y_ptr: np.ndarray,
        y_idx: np.ndarray,
        centroids: LabelCentroids,
        seed: int,
        nodes: NodeTrainer | None = None,
    ) -> LabelTree:
        """The tree over unit-norm ``rows`` (CSR: ptr, features, values) whose labels are
        ``y_idx[y_ptr[i]:y_ptr[i+1]]``, of the labels of ``centroids.n_labels`` that
        have a row: a label without one has no classifier to train
        (:data:`~dslide_dask.kernels.tree_query.UNSEEN`). The splits are made here; the
        nodes' classifiers are trained by ``nodes`` (None: :func:`train_levels`, here),
        which may train them anywhere: a node's classifiers depend on nothing else."""
        n_labels, n_features = centroids.n_labels, centroids.n_features
        ptr, idx, val = rows
        perm = np.flatnonzero(np.bincount(y_idx, minlength=n_labels)).astype(np.int64)
        if len(perm) == 0:
            perm = np.arange(n_labels, dtype=np.int64)
        n = len(perm)
        depth = leaf_depth(n)
        chunks = 4 * numba.get_num_threads()
        for d in range(depth):
            kernels.split_level(
                centroids.ptr,
                centroids.idx,
                centroids.val,
                perm,
                halvings(n, d),
                n_features,
                ITERATIONS,
                seed + d,
                chunks,
            )
        label_ptr, label_rows, _ = transpose(
            y_ptr, y_idx, np.ones(len(y_idx), np.float32), n_labels
        )
        n_rows = len(ptr) - 1
        sq_norms = np.bincount(
            np.repeat(np.arange(n_rows), np.diff(ptr)), weights=val * val, minlength=n_rows
        ).astype(np.float32)
        problem = NodeProblem(ptr, idx, val, sq_norms, label_ptr, label_rows, perm, n_features)
        levels = [halvings(n, d) for d in classifier_depths(depth)]
        jobs: list[list[tuple[np.ndarray, int]]] = []
        for v, starts in enumerate(levels):
            below = levels[v + 1] if v + 1 < len(levels) else np.arange(n + 1)
            cuts = np.searchsorted(below, starts)
            first = sum(len(level) for level in jobs)
            jobs.append(
                [
                    (below[a : b + 1], first + j)
                    for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True))
                ]
            )
        parts = [part for level in (nodes or train_levels)(problem, jobs, seed) for part in level]
        return cls(perm, *_levels(levels), *joined(parts))

    @property
    def n_labels(self) -> int:
        """Labels in the tree: those with a training row."""
        return len(self.perm)

    @functools.cached_property
    def n_features(self) -> int:
        """Features the classifiers weigh: up to the highest one weighed."""
        return int(self.w_feature.max(initial=-1)) + 1

    @functools.cached_property
    def position(self) -> np.ndarray:
        """Each label's place in tree order (-1: not in the tree), up to the highest."""
        out = np.full(int(self.perm.max(initial=-1)) + 1, -1, np.int64)
        out[self.perm] = np.arange(len(self.perm))
        return out

    def losses(
        self, query: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray
    ) -> np.ndarray:
        """For unit-norm ``query`` rows (CSR) and their candidates ``ids`` (-1: none):
        the sum of the squared hinge losses on each candidate's path (0 for none,
        :data:`~dslide_dask.kernels.tree_query.UNSEEN` for a label not in the tree)."""
        ptr, idx, val = sorted_rows(*query)
        return tree_query.path_losses(
            ptr,
            idx,
            val,
            ids,
            self.position,
            self.served[0],
            self.w_ptr,
            self.w_feature,
            self.w_val,
            self.bias,
            *self.served[1:],
            max(self.n_features, int(idx.max(initial=-1)) + 1),
            row_chunks(),
        )

    @functools.cached_property
    def served(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray,
                              np.ndarray]:  # fmt: skip
        """What :meth:`losses` reads beside the tree (derived, never stored): the child of
        each classifier level on each position's path, and the weights of the classifiers
        above the leaves by feature (about as many bytes again as theirs), so a row scores
        those all at once: ``(paths, f_ptr, f_child, f_val, n_inner, f_slot, f_dense)``,
        the frequent features' weights dense rows (:mod:`~dslide_dask.kernels.tree_inner`)."""
        n_inner = tree_query.inner_children(self.level_ptr, self.child_ptr)
        end = self.w_ptr[n_inner]  # the inner children's weights, by feature
        by_feature = transpose(
            self.w_ptr[: n_inner + 1], self.w_feature[:end], self.w_val[:end], self.n_features
        )
        ptr, child, val, slot, dense = tree_inner.dense_features(
            *by_feature, n_inner, int(np.ceil(tree_inner.DENSE_SHARE * n_inner))
        )
        paths = tree_query.child_paths(self.bounds, self.level_ptr, self.child_ptr)
        return paths, ptr, child, val, n_inner, slot, dense

    @functools.cached_property
    def leaf_nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(paths, starts)``: each leaf node's children above the leaves on its path,
        and its labels' first positions in tree order, then the end (derived)."""
        levels = len(self.level_ptr) - 1
        starts = self.bounds[self.level_ptr[levels - 1] : self.level_ptr[levels]]
        paths = self.served[0][starts[:-1], : levels - 1]
        return np.ascontiguousarray(paths), starts

    def searched(self, query: tuple[np.ndarray, np.ndarray, np.ndarray], beam: int) -> np.ndarray:
        """For unit-norm ``query`` rows (CSR): the labels of each row's ``beam`` leaf nodes
        of least loss above the leaves (-1 past a row's last), the tree's own candidates
        whatever the other sources propose (:mod:`~dslide_dask.kernels.tree_search`)."""
        ptr, idx, val = sorted_rows(*query)
        paths, starts = self.leaf_nodes
        served = self.served
        nodes = tree_search.best_leaves(ptr, idx, val, paths, self.bias, *served[1:], beam,
                                       row_chunks())  # fmt: skip
        return tree_search.node_labels(nodes, starts, self.perm, int(np.diff(starts).max()))

    @functools.cached_property
    def hot(self) -> tuple:
        """Its longest leaf classifiers by feature, as served rows score them (derived)."""
        w = self.w_ptr, self.w_feature, self.w_val, self.bias
        return tree_inner.hot_leaves(*w, self.served[4], self.n_features)

    def state(self) -> dict[str, np.ndarray]:
        """The arrays that define the tree (:data:`ARRAYS`)."""
        return {name: getattr(self, name) for name in ARRAYS}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], n_labels: int, n_features: int) -> LabelTree:
        """The tree :meth:`state` described, checked so that :meth:`losses` reads nothing
        out of bounds (ValueError naming the array)."""
        a = {name: np.ascontiguousarray(arrays[name]) for name in ARRAYS}
        for name in ARRAYS:
            want = DTYPES.get(name, np.int64)
            if a[name].dtype != want or a[name].ndim != 1:
                raise ValueError(f"{name} must be 1-D {np.dtype(want)}")
        perm, bounds, level_ptr = a["perm"], a["bounds"], a["level_ptr"]
        n = len(perm)
        if not (0 < n <= n_labels and 0 <= perm.min() <= perm.max() < n_labels) or (
            len(np.unique(perm)) != n
        ):
            raise ValueError(f"perm must list distinct labels of the {n_labels}")
        _pointer(level_ptr, len(bounds), "level_ptr")
        levels = [bounds[level_ptr[v] : level_ptr[v + 1]] for v in range(len(level_ptr) - 1)]
        if not levels or len(levels[0]) != 2:
            raise ValueError("bounds must begin with the root, [0, labels in perm]")
        for v, starts in enumerate(levels):
            if len(starts) < 2 or starts[0] != 0 or starts[-1] != n:
                raise ValueError(f"bounds of level {v} must run from 0 to {n}")
            if (np.diff(starts) <= 0).any():
                raise ValueError(f"bounds of level {v} must rise")
            if v and not np.isin(levels[v - 1], starts).all():
                raise ValueError(f"level {v}'s nodes must split level {v - 1}'s")
        n_children = np.concatenate(
            [
                np.diff(np.searchsorted(levels[v + 1], starts))
                if v + 1 < len(levels)
                else np.diff(starts)
                for v, starts in enumerate(levels)
            ]
        )
        child_ptr, w_ptr, w_feature = a["child_ptr"], a["w_ptr"], a["w_feature"]
        if len(child_ptr) != len(n_children) + 1:
            raise ValueError(f"child_ptr must have {len(n_children) + 1} entries")
        _pointer(child_ptr, len(a["bias"]), "child_ptr")
        if not np.array_equal(np.diff(child_ptr), n_children):
            raise ValueError("child_ptr must count each node's children")
        if len(w_ptr) != len(a["bias"]) + 1:
            raise ValueError("w_ptr must have an entry a child, then the end")
        _pointer(w_ptr, len(w_feature), "w_ptr")
        if len(a["w_val"]) != len(w_feature):
            raise ValueError("w_val and w_feature must hold as many entries")
        if len(w_feature) and not 0 <= w_feature.min() <= w_feature.max() < n_features:
            raise ValueError(f"w_feature must lie in [0, {n_features})")
        owner = np.repeat(np.arange(len(a["bias"])), np.diff(w_ptr))
        if (np.diff(w_feature)[owner[1:] == owner[:-1]] <= 0).any():
            raise ValueError("w_feature must rise within each classifier")
        if not (np.isfinite(a["w_val"]).all() and np.isfinite(a["bias"]).all()):
            raise ValueError("w_val and bias must be finite")
        return cls(**a)


def _pointer(ptr: np.ndarray, end: int, name: str) -> None:
    """ValueError unless ``ptr`` starts at 0, never falls and ends at ``end``."""
    if len(ptr) < 1 or ptr[0] != 0 or ptr[-1] != end or (np.diff(ptr) < 0).any():
        raise ValueError(f"{name} must run from 0 to {end} and never fall")


def leaf_depth(n_labels: int) -> int:
    """Halvings until no node holds more than :data:`LEAF` labels."""
    depth = 0
    while -(-n_labels // (1 << depth)) > LEAF:
        depth += 1
    return depth


def classifier_depths(depth: int) -> list[int]:
    """The depths of the classifier nodes: the root, then every :data:`SPAN` halvings up
    from the leaves' ``depth``."""
    return sorted({0, *range(depth, 0, -SPAN)})


def build_forest(
    rows: tuple[np.ndarray, np.ndarray, np.ndarray],
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    centroids: LabelCentroids,
    seeds: Sequence[int],
    nodes: NodeTrainer | None = None,
) -> tuple[LabelTree, ...]:
    """A tree of each seed (:meth:`LabelTree.build`), built side by side on a share of
    numba's threads each. A tree's top levels are a node or two, and a node takes one
    thread, so a tree built alone leaves threads idle there: two trees on 2 threads took
    6.5 s instead of 7.9 on debian-files-rare, 13.5 instead of 17.9 on amazon-670k. A
    tree does not depend on how many threads built it. numba's workqueue threading layer
    (where neither OpenMP nor TBB is found) cannot run two parallel kernels at once, so
    there the trees are built one by one, as they are when ``nodes`` trains their
    classifiers elsewhere (:meth:`LabelTree.build`)."""
    if nodes is not None:
        return tuple(LabelTree.build(rows, y_ptr, y_idx, centroids, s, nodes) for s in seeds)
    threads = numba.get_num_threads() if _threadsafe() else 1
    at_once = min(len(seeds), threads)
    if at_once < 2:
        return tuple(LabelTree.build(rows, y_ptr, y_idx, centroids, seed) for seed in seeds)
    share = threads // at_once

    def build(seed: int) -> LabelTree:
        numba.set_num_threads(share)  # the pool's own thread: its setting is its own
        return LabelTree.build(rows, y_ptr, y_idx, centroids, seed)

    with ThreadPoolExecutor(at_once) as pool:
        return tuple(pool.map(build, seeds))


def _threadsafe() -> bool:
    """Whether numba's threading layer runs parallel kernels from two threads at once."""
    try:
        return numba.threading_layer() != "workqueue"
    except ValueError:  # no parallel kernel has run yet: the layer is not chosen
        return False


def mostly_rare(y_idx: np.ndarray, n_labels: int) -> bool:
    """Whether labels of at most :data:`RARE_ROWS` training rows hold :data:`RARE_SHARE`
    or more of the training labels ``y_idx`` (a label once per row it is on)."""
    return mostly_rare_counts(np.bincount(y_idx, minlength=n_labels))


def mostly_rare_counts(counts: np.ndarray) -> bool:
    """:func:`mostly_rare` from each label's count of training rows."""
    total = int(counts.sum())
    return total > 0 and bool(int(counts[counts <= RARE_ROWS].sum()) >= RARE_SHARE * total)


def trees_for(y_idx: np.ndarray, n_labels: int) -> int:
    """How many label trees to build for training labels ``y_idx``: 2 where they are
    :func:`mostly_rare`, else 1. The tree is what ranks rare labels (the network learns
    them least) and a single tree's ranking moves with its seed, so the mean of two pays
    for its build there: P@1 +0.004-0.005 where labels of at most 3 rows hold half the
    training labels, +0.001 where they hold a tenth to a quarter (docs/accuracy.md)."""
    return 2 if mostly_rare(y_idx, n_labels) else 1


def halvings(n_labels: int, depth: int) -> np.ndarray:
    """The first positions of the ``2**depth`` nodes at ``depth``, then ``n_labels``:
    each node's first half (``size // 2``) its first child."""
    bounds = np.array([0, n_labels], np.int64)
    for _ in range(depth):
        mids = bounds[:-1] + (bounds[1:] - bounds[:-1]) // 2
        bounds = np.insert(bounds, np.arange(1, len(bounds)), mids)
    return bounds


def _levels(levels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The levels' bounds as one array and where each level's begin."""
    level_ptr = np.zeros(len(levels) + 1, np.int64)
    np.cumsum([len(b) for b in levels], out=level_ptr[1:])
    return np.concatenate(levels), level_ptr


def sorted_rows(
    ptr: np.ndarray, idx: np.ndarray, val: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR rows with their features ascending (the tree's dot products merge them)."""
    if len(idx) < 2:
        return ptr, idx, val
    rows = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    if ((np.diff(idx) > 0) | (rows[1:] != rows[:-1])).all():
        return ptr, idx, val
    order = np.lexsort((idx, rows))
    return ptr, idx[order], val[order]

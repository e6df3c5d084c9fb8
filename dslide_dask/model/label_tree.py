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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.kernels import label_tree as kernels
from dslide_dask.kernels.neighbours import transpose
from dslide_dask.model.label_centroids import LabelCentroids

#: A leaf holds at most this many labels (Parabel's and omikuji's 100).
LEAF = 100
#: Halvings between two classifier nodes: a node has at most 2**SPAN children (64).
SPAN = 6
#: Rounds of the balanced 2-means at each split.
ITERATIONS = 6
#: The classifiers' C, passes and pruning: the label classifiers' (docs/accuracy.md).
C, PASSES, PRUNE = 1.0, 6, 0.1
#: The arrays that define a tree (:meth:`LabelTree.state`).
ARRAYS = (
    "perm",
    "bounds",
    "level_ptr",
    "node_feat_ptr",
    "features",
    "w_ptr",
    "w_child",
    "w_val",
    "child_ptr",
    "bias",
)

#: The arrays not of int64.
DTYPES: dict[str, type] = {"w_child": np.int32, "w_val": np.float32, "bias": np.float32}


@dataclass(frozen=True, eq=False)
class LabelTree:
    """Labels in tree order ``perm``; classifier level ``v``'s nodes begin at positions
    ``bounds[level_ptr[v]:level_ptr[v+1]]`` (the last entry: the end); node ``n``
    (numbered level by level) holds its children's weights by feature over
    ``node_feat_ptr[n]:node_feat_ptr[n+1]`` of ``features`` (``w_child/w_val`` through
    ``w_ptr``) and their biases at ``bias[child_ptr[n]:child_ptr[n+1]]``."""

    perm: np.ndarray
    bounds: np.ndarray
    level_ptr: np.ndarray
    node_feat_ptr: np.ndarray
    features: np.ndarray
    w_ptr: np.ndarray
    w_child: np.ndarray
    w_val: np.ndarray
    child_ptr: np.ndarray
    bias: np.ndarray

    @classmethod
    def build(
        cls,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray],
        y_ptr: np.ndarray,
        y_idx: np.ndarray,
        centroids: LabelCentroids,
        seed: int,
    ) -> LabelTree:
        """The tree of ``centroids.n_labels`` labels over unit-norm ``rows`` (CSR: ptr,
        features, values) whose labels are ``y_idx[y_ptr[i]:y_ptr[i+1]]``."""
        n_labels, n_features = centroids.n_labels, centroids.n_features
        ptr, idx, val = rows
        depth = leaf_depth(n_labels)
        perm = np.arange(n_labels, dtype=np.int64)
        chunks = 4 * numba.get_num_threads()
        for d in range(depth):
            kernels.split_level(
                centroids.ptr,
                centroids.idx,
                centroids.val,
                perm,
                halvings(n_labels, d),
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
        problem = (ptr, idx, val, sq_norms, label_ptr, label_rows, perm)
        threads = numba.get_num_threads()
        scratch = [
            (np.full(n_rows, -1, np.int64), np.full(n_features, -1, np.int64))
            for _ in range(threads)
        ]

        def train(children: np.ndarray, node: int, worker: int, blocks: int) -> tuple:
            return kernels.train_node(
                *problem, children, PASSES, C, PRUNE, seed + node, blocks, *scratch[worker]
            )

        levels = [halvings(n_labels, d) for d in classifier_depths(depth)]
        parts: list[tuple] = []
        for v, starts in enumerate(levels):
            below = levels[v + 1] if v + 1 < len(levels) else np.arange(n_labels + 1)
            cuts = np.searchsorted(below, starts)
            jobs = [
                (below[a : b + 1], len(parts) + j)
                for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True))
            ]
            parts += _trained(jobs, train, threads)
        return cls(perm, *_levels(levels), *_joined(parts))

    @property
    def n_labels(self) -> int:
        return len(self.perm)

    def position(self) -> np.ndarray:
        """Each label's place in tree order."""
        out = np.empty(len(self.perm), np.int64)
        out[self.perm] = np.arange(len(self.perm))
        return out

    def losses(
        self, query: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray
    ) -> np.ndarray:
        """For unit-norm ``query`` rows (CSR) and their candidates ``ids`` (-1: none):
        the sum of the squared hinge losses on each candidate's path (0 for none)."""
        return kernels.path_losses(
            *query,
            ids,
            self.position(),
            self.bounds,
            self.level_ptr,
            self.node_feat_ptr,
            self.features,
            self.w_ptr,
            self.w_child,
            self.w_val,
            self.child_ptr,
            self.bias,
            4 * numba.get_num_threads(),
        )

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
        if len(perm) != n_labels or not np.array_equal(np.sort(perm), np.arange(n_labels)):
            raise ValueError(f"perm must order the {n_labels} labels")
        _pointer(level_ptr, len(bounds), "level_ptr")
        levels = [bounds[level_ptr[v] : level_ptr[v + 1]] for v in range(len(level_ptr) - 1)]
        if not levels or len(levels[0]) != 2:
            raise ValueError("bounds must begin with the root, [0, n_labels]")
        for v, starts in enumerate(levels):
            if len(starts) < 2 or starts[0] != 0 or starts[-1] != n_labels:
                raise ValueError(f"bounds of level {v} must run from 0 to {n_labels}")
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
        child_ptr, node_feat_ptr = a["child_ptr"], a["node_feat_ptr"]
        if len(child_ptr) != len(n_children) + 1 or len(node_feat_ptr) != len(child_ptr):
            raise ValueError(f"child_ptr and node_feat_ptr must have {len(n_children) + 1} entries")
        _pointer(child_ptr, len(a["bias"]), "child_ptr")
        if not np.array_equal(np.diff(child_ptr), n_children):
            raise ValueError("child_ptr must count each node's children")
        features, w_ptr, w_child = a["features"], a["w_ptr"], a["w_child"]
        _pointer(node_feat_ptr, len(features), "node_feat_ptr")
        if len(features) and not 0 <= features.min() <= features.max() < n_features:
            raise ValueError(f"features must lie in [0, {n_features})")
        node = np.repeat(np.arange(len(n_children)), np.diff(node_feat_ptr))
        if (np.diff(features)[node[1:] == node[:-1]] <= 0).any():
            raise ValueError("features must rise within each node")
        if len(w_ptr) != len(features) + 1:
            raise ValueError("w_ptr must have an entry a feature, then the end")
        _pointer(w_ptr, len(w_child), "w_ptr")
        if len(a["w_val"]) != len(w_child):
            raise ValueError("w_val and w_child must hold as many entries")
        owner = np.repeat(node, np.diff(w_ptr))
        if len(w_child) and ((w_child < 0) | (w_child >= n_children[owner])).any():
            raise ValueError("w_child must name a child of its node")
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


def halvings(n_labels: int, depth: int) -> np.ndarray:
    """The first positions of the ``2**depth`` nodes at ``depth``, then ``n_labels``:
    each node's first half (``size // 2``) its first child."""
    bounds = np.array([0, n_labels], np.int64)
    for _ in range(depth):
        mids = bounds[:-1] + (bounds[1:] - bounds[:-1]) // 2
        bounds = np.insert(bounds, np.arange(1, len(bounds)), mids)
    return bounds


def _trained(jobs: list[tuple[np.ndarray, int]], train, threads: int) -> list[tuple]:
    """Each job's ``train(children, node, worker, blocks)``, in order. Many nodes: a
    node a thread at once (small nodes waste a parallel pass's start-up); few: one at a
    time over all threads. A node's result does not depend on which."""
    if threads < 2 or len(jobs) < 2 * threads:
        return [train(children, node, 0, threads) for children, node in jobs]

    def work(worker: int) -> list[tuple]:
        return [train(children, node, worker, 1) for children, node in jobs[worker::threads]]

    with ThreadPoolExecutor(threads) as pool:
        shares = list(pool.map(work, range(threads)))
    out: list[tuple] = [None] * len(jobs)  # type: ignore[list-item]
    for worker, share in enumerate(shares):
        out[worker::threads] = share
    return out


def _levels(levels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The levels' bounds as one array and where each level's begin."""
    level_ptr = np.zeros(len(levels) + 1, np.int64)
    np.cumsum([len(b) for b in levels], out=level_ptr[1:])
    return np.concatenate(levels), level_ptr


def _joined(parts: list) -> tuple[np.ndarray, ...]:
    """The nodes' trained weights as one set of arrays (:class:`LabelTree`'s last seven)."""
    node_feat_ptr = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p[0]) for p in parts], out=node_feat_ptr[1:])
    w_offsets = np.cumsum([0] + [p[1][-1] for p in parts])
    w_ptr = np.concatenate([[0]] + [p[1][1:] + w_offsets[n] for n, p in enumerate(parts)])
    child_ptr = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p[4]) for p in parts], out=child_ptr[1:])
    return (
        node_feat_ptr,
        np.concatenate([p[0] for p in parts]).astype(np.int64),
        w_ptr.astype(np.int64),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]),
        child_ptr,
        np.concatenate([p[4] for p in parts]),
    )

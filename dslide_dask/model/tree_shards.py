"""Label trees held in pieces: each process keeps the node classifiers it trained.

A tree's weights are the fused model's largest part (3.9 GB of ``amazon-3m``'s 300K
rows), and a candidate's path loss is a sum over the classifiers on its path, so the
trees need never be in one place: a process that trained some nodes keeps them
(:class:`KeptNodes`) in a *partial* tree, the whole tree's shape with only its nodes'
weights, and a query's loss is the sum of the partial trees' (:func:`summed_losses`).
A node not kept is *weightless*: no weights and a bias of 1, so each of its children
scores 1 and its squared hinge loss ``max(0, 1 - 1)**2`` is 0. Saved, each piece
writes its nodes (:meth:`KeptNodes.segment`); loaded whole, the pieces are
:func:`merged` back into one tree, the same arrays as a tree trained in one process.
Nothing here knows where the pieces are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels.neighbours import normalised
from dslide_dask.kernels.tree_parts import inner_path_losses, leaf_path_losses
from dslide_dask.kernels.tree_query import UNSEEN
from dslide_dask.model.label_tree import LabelTree, sorted_rows
from dslide_dask.model.row_chunks import row_chunks
from dslide_dask.model.tree_nodes import joined

#: A weightless node's bias: its children score 1, a squared hinge loss of 0.
WEIGHTLESS_BIAS = np.float32(1.0)
#: The arrays of a saved piece of a tree: the nodes it holds (ascending), then those
#: nodes' classifiers joined as a tree's are (child_ptr, w_ptr, w_feature, w_val, bias).
SEGMENT = ("nodes", "child_ptr", "w_ptr", "w_feature", "w_val", "bias")
#: The arrays of a tree's shape, which every piece shares.
SHAPE = ("perm", "bounds", "level_ptr", "child_ptr")


class TreeLosses(Protocol):
    """What re-ranking asks of label trees wherever they are: for rows ``X`` and their
    candidates ``ids`` (-1: none) of fused ``scores``, the mean over the trees of the path
    loss of each candidate that can be among a row's ``k`` best by ``scores *
    exp(-power * loss)`` (0 for none, :data:`~dslide_dask.kernels.tree_query.UNSEEN` for
    a label without a training row, ``inf`` for a candidate that cannot be: as
    :func:`~dslide_dask.model.tree_serving.forest_topk_losses` answers for whole trees)."""

    def topk_losses(
        self, X: CSR, ids: np.ndarray, scores: np.ndarray, *, power: float, k: int
    ) -> np.ndarray: ...


def weightless(n_children: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A node's part (as :func:`~dslide_dask.model.tree_nodes.joined` takes them) that
    adds nothing to a path loss."""
    return (
        np.zeros(n_children + 1, np.int64),
        np.empty(0, np.int32),
        np.empty(0, np.float32),
        np.full(n_children, WEIGHTLESS_BIAS, np.float32),
    )


def unit_query(X: CSR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``X`` as a tree reads them: CSR of unit rows."""
    return X.indptr, X.indices, normalised(X.indptr, X.values())


def forest_losses(trees: tuple[LabelTree, ...], X: CSR, ids: np.ndarray) -> np.ndarray:
    """The mean over ``trees`` of :meth:`LabelTree.losses` (partial trees: their share)."""
    return mean_losses(trees, unit_query(X), ids)


def mean_losses(
    trees: tuple[LabelTree, ...], query: tuple[np.ndarray, np.ndarray, np.ndarray], ids
) -> np.ndarray:
    """:func:`forest_losses` of a query already in unit rows."""
    ids = np.ascontiguousarray(ids, np.int64)
    total = trees[0].losses(query, ids)
    for tree in trees[1:]:
        total += tree.losses(query, ids)
    return total / np.float32(len(trees))


def inner_losses(trees: tuple[LabelTree, ...], X: CSR, ids: np.ndarray) -> np.ndarray:
    """The mean over ``trees`` of the losses above the leaves on the paths of candidates
    ``ids`` of rows ``X`` (partial trees: their share)."""
    ptr, idx, val = sorted_rows(*unit_query(X))
    ids = np.ascontiguousarray(ids, np.int64)
    total = np.zeros(ids.shape, np.float32)
    for tree in trees:
        paths, f_ptr, f_child, f_val, n_inner, f_slot, f_dense = tree.served
        total += inner_path_losses(ptr, idx, val, ids, tree.position, paths, tree.bias, f_ptr,
                                   f_child, f_val, n_inner, f_slot, f_dense,
                                   row_chunks())  # fmt: skip
    return total / np.float32(len(trees))


def leaf_losses(
    trees: tuple[LabelTree, ...], X: CSR, ids: np.ndarray, chosen: np.ndarray
) -> np.ndarray:
    """The mean over ``trees`` of the leaf classifiers' losses of the candidates ``ids``
    of rows ``X`` where ``chosen`` (0 elsewhere; partial trees: those of their leaves)."""
    ptr, idx, val = sorted_rows(*unit_query(X))
    ids = np.ascontiguousarray(ids, np.int64)
    chosen = np.ascontiguousarray(chosen, np.bool_)
    total = np.zeros(ids.shape, np.float32)
    for tree in trees:
        n_features = max(tree.n_features, int(idx.max(initial=-1)) + 1)
        total += leaf_path_losses(ptr, idx, val, ids, chosen, tree.position, tree.served[0],
                                  tree.w_ptr, tree.w_feature, tree.w_val, tree.bias,
                                  n_features, row_chunks())  # fmt: skip
    return total / np.float32(len(trees))


def rounds_topk_losses(
    inner: np.ndarray,
    leaves: Callable[[np.ndarray], np.ndarray],
    ids: np.ndarray,
    scores: np.ndarray,
    power: float,
    k: int,
) -> np.ndarray:
    """:class:`TreeLosses`' answer from the trees' losses above the leaves (``inner``)
    and their leaf losses of the candidates chosen (``leaves(chosen)``), asked twice:
    first each row's ``k`` best by the bound the losses above the leaves give (a leaf's
    loss is at least 0), then those whose bound still reaches the ``k``-th best score
    the first found. Whole trees score leaves one at a time in the bound's order and stop
    at the same point (:func:`~dslide_dask.kernels.tree_query.bounded_losses`), so the
    ``k`` best come out the same; pieces score a few more leaves for two round trips."""
    valid = ids >= 0
    rows = np.arange(len(ids))[:, None]
    bound = np.where(valid, np.maximum(scores, 0) * np.exp(-power * inner), -np.inf)
    first = np.zeros(ids.shape, bool)
    first[rows, np.argsort(-bound, axis=1, kind="stable")[:, :k]] = True
    first &= valid
    out = np.where(valid, np.inf, 0).astype(np.float32)
    out[first] = inner[first] + leaves(first)[first]
    final = np.where(first, scores * np.exp(-power * out), -np.inf)
    kth = -np.sort(-final, axis=1)[:, k - 1 : k] if k <= ids.shape[1] else -np.inf
    second = valid & ~first & (bound >= kth * (1.0 - 1e-5))
    if second.any():
        out[second] = inner[second] + leaves(second)[second]
    return out


def summed_losses(parts: list[np.ndarray]) -> np.ndarray:
    """The path losses of whole trees from their pieces' :func:`forest_losses`: each
    piece's share added, but a label without a training row is :data:`UNSEEN` once (every
    piece says so)."""
    total = np.sum(parts, axis=0, dtype=np.float32)
    return np.where(parts[0] == UNSEEN, UNSEEN, total).astype(np.float32)


@dataclass
class KeptNodes:
    """The node classifiers one process trained, by tree and node, until the trees'
    shapes are known (:meth:`partial`)."""

    parts: dict[int, dict[int, tuple]]

    @classmethod
    def empty(cls) -> KeptNodes:
        return cls({})

    def keep(self, tree: int, nodes: list[int], parts: list[tuple]) -> None:
        self.parts.setdefault(tree, {}).update(zip(nodes, parts, strict=True))

    def partial(self, tree: int, shape: LabelTree) -> LabelTree:
        """Tree ``tree`` with only the nodes kept here weighed, of the ``shape`` the
        builder made (any tree of those splits: its weights are not read). The kept
        parts are let go as they are copied in."""
        child_ptr = shape.child_ptr
        mine = self.parts.pop(tree, {})
        parts = [
            mine.pop(n) if n in mine else weightless(int(child_ptr[n + 1] - child_ptr[n]))
            for n in range(len(child_ptr) - 1)
        ]
        _, w_ptr, w_feature, w_val, bias = joined(parts)
        return LabelTree(shape.perm, shape.bounds, shape.level_ptr, child_ptr,
                         w_ptr, w_feature, w_val, bias)  # fmt: skip


def node_part(arrays: tuple[np.ndarray, ...], n: int) -> tuple:
    """Node ``n``'s part (as :func:`~dslide_dask.model.tree_nodes.joined` takes them) of
    nodes joined into ``arrays`` (child_ptr, w_ptr, w_feature, w_val, bias), as views."""
    child_ptr, w_ptr, w_feature, w_val, bias = arrays
    a, z = child_ptr[n], child_ptr[n + 1]
    lo, hi = w_ptr[a], w_ptr[z]
    return w_ptr[a : z + 1] - lo, w_feature[lo:hi], w_val[lo:hi], bias[a:z]


def segment(tree: LabelTree, nodes: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays (:data:`SEGMENT`) a piece of ``tree`` that weighs ``nodes`` saves."""
    joined_arrays = (tree.child_ptr, tree.w_ptr, tree.w_feature, tree.w_val, tree.bias)
    child_ptr, w_ptr, w_feature, w_val, bias = joined([node_part(joined_arrays, n) for n in nodes])
    out = dict(zip(SEGMENT[1:], (child_ptr, w_ptr, w_feature, w_val, bias), strict=True))
    return {"nodes": np.asarray(nodes, np.int64), **out}


def merged(
    shape: dict[str, np.ndarray], segments: list[dict[str, np.ndarray]], whole: bool = True
) -> dict:
    """A tree's arrays (``LabelTree.state``) from its ``shape`` (:data:`SHAPE`) and saved
    pieces of it, no node in two: ``whole``, every node in one of them; else the nodes
    of none weightless (a partial tree). ValueError says what does not fit: a piece of
    another tree, a node missing or twice."""
    child_ptr = shape["child_ptr"]
    n_nodes = len(child_ptr) - 1
    owner = np.full(n_nodes, -1, np.int64)
    for s, seg in enumerate(segments):
        nodes, local = seg["nodes"], seg["child_ptr"]
        if nodes.ndim != 1 or len(local) != len(nodes) + 1 or (np.diff(nodes) <= 0).any():
            raise ValueError(f"piece {s}: nodes must rise, one child_ptr entry each")
        if len(nodes) and not 0 <= nodes[0] <= nodes[-1] < n_nodes:
            raise ValueError(f"piece {s}: nodes must lie in [0, {n_nodes})")
        if (owner[nodes] >= 0).any():
            raise ValueError(f"piece {s}: a node is in two pieces")
        widths = child_ptr[nodes + 1] - child_ptr[nodes]
        if local[0] != 0 or not np.array_equal(np.diff(local), widths):
            raise ValueError(f"piece {s}: its nodes' children are not the tree's")
        if len(seg["w_ptr"]) != local[-1] + 1 or len(seg["bias"]) != local[-1]:
            raise ValueError(f"piece {s}: w_ptr and bias must cover its children")
        if seg["w_ptr"][0] != 0 or seg["w_ptr"][-1] != len(seg["w_feature"]):
            raise ValueError(f"piece {s}: w_ptr must run over its weights")
        if (np.diff(seg["w_ptr"]) < 0).any() or len(seg["w_val"]) != len(seg["w_feature"]):
            raise ValueError(f"piece {s}: w_ptr must never fall")
        owner[nodes] = s
    if whole and (owner < 0).any():
        raise ValueError(f"node {int(np.argmax(owner < 0))} is in no piece")
    parts = []
    place = [0] * len(segments)
    for n in range(n_nodes):
        if owner[n] < 0:
            parts.append(weightless(int(child_ptr[n + 1] - child_ptr[n])))
            continue
        seg, j = segments[owner[n]], place[owner[n]]
        place[owner[n]] += 1
        parts.append(node_part(tuple(seg[name] for name in SEGMENT[1:]), j))
    _, w_ptr, w_feature, w_val, bias = joined(parts)
    return {**{name: shape[name] for name in SHAPE}, "w_ptr": w_ptr, "w_feature": w_feature,
            "w_val": w_val, "bias": bias}  # fmt: skip

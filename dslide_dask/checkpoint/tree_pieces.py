"""Label trees saved in pieces, each by the worker that holds it.

A cluster's trees are kept in pieces (:mod:`dslide_dask.model.tree_shards`); each piece
writes its nodes' classifiers into the index's folder as ``tree_p{piece}_{array}.npy``
(``tree2_p...`` for the second tree), piece 0 the trees' shapes as a whole tree's are
named (``tree_perm.npy``...). The entries go into the index's manifest with the rest, so
a model saved in pieces is checked like any other, and loaded whole it is one tree
again (:func:`joined_trees`): the same arrays as a tree trained in one process.
"""

from __future__ import annotations

import posixpath
import re

import fsspec
import numpy as np

from dslide_dask.checkpoint.arrays import write_array
from dslide_dask.model import label_tree
from dslide_dask.model.label_tree import LabelTree
from dslide_dask.model.tree_shards import SEGMENT, SHAPE, merged, segment
from dslide_dask.paths import guard_write

#: A piece's array: tree prefix (``tree`` or ``tree2``...), piece number, array name.
PIECE = re.compile(r"^(tree\d*)_p(\d{1,5})_(" + "|".join(SEGMENT) + r")$")
#: The folder of the index (``checkpoint.neighbours.FOLDER``).
FOLDER = "neighbours"


def tree_prefix(t: int) -> str:
    """Tree ``t``'s name in a checkpoint (``label_tree`` arrays: ``tree_perm``, ``tree2_perm``)."""
    return f"tree{t + 1 if t else ''}"


def save_tree_piece(
    folder_url: str,
    trees: tuple[LabelTree, ...],
    nodes: tuple[np.ndarray, ...],
    piece: int,
    storage_options: dict | None = None,
) -> dict[str, dict]:
    """Write piece ``piece`` of ``trees`` (partial trees weighing ``nodes``) into the
    checkpoint folder ``folder_url``; the manifest entries of the arrays written."""
    fs, root = fsspec.core.url_to_fs(folder_url, **(storage_options or {}))
    folder = posixpath.join(root, FOLDER)
    guard_write(fs, root, folder)
    fs.makedirs(folder, exist_ok=True)
    entries = {}
    for t, (tree, held) in enumerate(zip(trees, nodes, strict=True)):
        prefix = tree_prefix(t)
        arrays = {f"{prefix}_p{piece}_{k}": v for k, v in segment(tree, held).items()}
        if piece == 0:
            arrays.update({f"{prefix}_{name}": getattr(tree, name) for name in SHAPE})
        for name, array in arrays.items():
            path = guard_write(fs, root, posixpath.join(folder, name + ".npy"))
            entries[name] = write_array(fs, path, array)
    return entries


def is_piece(name: str) -> bool:
    return PIECE.match(name) is not None


def piece_of(name: str) -> int:
    """The piece number of a piece's array name."""
    return int(PIECE.match(name).group(2))  # type: ignore[union-attr]


def joined_trees(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` (an index's, by checkpoint name) with each tree saved in pieces joined
    into a whole tree's arrays; ValueError naming the tree whose pieces do not fit."""
    prefixes = {PIECE.match(n).group(1) for n in arrays if is_piece(n)}  # type: ignore[union-attr]
    for prefix in sorted(prefixes):
        state, _ = _pieces_of(arrays, prefix, whole=True)
        arrays.update({f"{prefix}_{name}": a for name, a in state.items()})
    return arrays


def partial_tree(arrays: dict[str, np.ndarray], prefix: str) -> tuple[dict, np.ndarray]:
    """The state of tree ``prefix`` weighing only the nodes of the pieces in ``arrays``
    (the rest weightless), and those nodes."""
    return _pieces_of(arrays, prefix, whole=False)


def _pieces_of(arrays: dict, prefix: str, whole: bool) -> tuple[dict, np.ndarray]:
    """Tree ``prefix``'s pieces taken out of ``arrays`` and merged with its shape."""
    tree = f"label tree {prefix[4:] or 1}"
    by_piece: dict[int, dict[str, np.ndarray]] = {}
    for name in [n for n in arrays if is_piece(n) and n.startswith(f"{prefix}_p")]:
        _, piece, array = PIECE.match(name).groups()  # type: ignore[union-attr]
        by_piece.setdefault(int(piece), {})[array] = arrays.pop(name)
    if any(f"{prefix}_{name}" not in arrays for name in SHAPE):
        raise ValueError(f"{tree}: saved in pieces without its shape")
    shape: dict[str, np.ndarray] = {name: arrays[f"{prefix}_{name}"] for name in SHAPE}
    for name, a in shape.items():
        if a.dtype != np.int64 or a.ndim != 1:
            raise ValueError(f"{tree}: {name} must be 1-D int64")
    ptr = shape["child_ptr"]
    if len(ptr) < 2 or ptr[0] != 0 or (np.diff(ptr) < 0).any():
        raise ValueError(f"{tree}: child_ptr must run from 0 and never fall")
    if whole and sorted(by_piece) != list(range(len(by_piece))):
        raise ValueError(f"{tree}: pieces {sorted(by_piece)}, not 0 to n-1")
    segments = [by_piece[p] for p in sorted(by_piece)]
    for p, seg in zip(sorted(by_piece), segments, strict=True):
        if set(seg) != set(SEGMENT):
            raise ValueError(f"{tree} piece {p}: arrays {sorted(SEGMENT)}")
        for name, want in _DTYPES.items():
            if seg[name].dtype != want or seg[name].ndim != 1:
                raise ValueError(f"{tree} piece {p}: {name} must be 1-D {want}")
    try:
        state = merged(shape, segments, whole)
    except ValueError as err:
        raise ValueError(f"{tree}: {err}") from None
    held = np.concatenate([seg["nodes"] for seg in segments] or [np.zeros(0, np.int64)])
    return state, np.sort(held)


#: A piece's arrays' dtypes: a tree's (``label_tree.DTYPES``; the rest int64).
_DTYPES = {name: np.dtype(label_tree.DTYPES.get(name, np.int64)) for name in SEGMENT}

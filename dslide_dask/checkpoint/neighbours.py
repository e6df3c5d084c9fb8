"""A saved model's neighbour index: ``neighbours/`` beside the model's arrays.

Its own small manifest (``neighbours/index.json``) lists the arrays with their sizes and
checksums, read and checked as the model's are (no pickle, nothing outside the folder, a
bounded metadata read), so a model saved without an index loads as before.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Collection

import fsspec
import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError, read_array, write_array
from dslide_dask.checkpoint.schema import check_entry
from dslide_dask.checkpoint.tree_pieces import (
    is_piece,
    joined_trees,
    partial_tree,
    piece_of,
    tree_prefix,
)
from dslide_dask.model.label_tree import LabelTree
from dslide_dask.model.neighbours import (
    ARRAYS,
    CLASSIFIER_ARRAYS,
    EMBEDDING,
    TREE_ARRAYS,
    NeighbourIndex,
)
from dslide_dask.model.tree_shards import SHAPE
from dslide_dask.paths import guard_read, guard_write, read_small

FOLDER = "neighbours"
MANIFEST = "index.json"
FORMAT = "dslide-dask neighbour index"
MANIFEST_MAX_BYTES = 1 << 20


def save_neighbours(
    url: str,
    index: NeighbourIndex,
    storage_options: dict | None = None,
    pieces: dict[str, dict] | None = None,
) -> None:
    """Write ``index`` into the checkpoint folder ``url``, listing beside its arrays those
    its label trees' ``pieces`` wrote there (their entries: :mod:`.tree_pieces`)."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    folder = posixpath.join(root, FOLDER)
    guard_write(fs, root, folder)
    fs.makedirs(folder, exist_ok=True)
    arrays = {}
    for name, array in index.state().items():
        path = guard_write(fs, root, posixpath.join(folder, name + ".npy"))
        arrays[name] = write_array(fs, path, array)
    arrays.update(pieces or {})
    manifest = {"format": FORMAT, "n_labels": index.n_labels, "arrays": arrays}
    with fs.open(guard_write(fs, root, posixpath.join(folder, MANIFEST)), "w") as f:
        json.dump(manifest, f)


def model_expects(meta: dict, weight: tuple[float, ...] | None, tree_power: float) -> dict:
    """What a model of checkpoint metadata ``meta``, fused with ``weight`` (input, hidden,
    classifiers, centroids) and label trees of power ``tree_power``, needs of its index:
    :func:`load_neighbours`'s keyword arguments."""
    weight = tuple(weight or ())
    needs = {
        EMBEDDING: len(weight) > 1 and weight[1] > 0,
        "label classifiers": len(weight) > 2 and weight[2] > 0,
        "label trees": tree_power > 0,
    }
    return {
        "n_features": int(meta["n_features"]),
        "n_labels": int(meta["n_labels"]),
        "width": int(meta["config"]["hidden"][-1]),
        "needs": {part for part, needed in needs.items() if needed},
    }


def load_neighbours(
    url: str,
    storage_options: dict | None = None,
    *,
    n_features: int | None = None,
    n_labels: int | None = None,
    width: int | None = None,
    needs: Collection[str] | None = None,
    trees: bool = True,
) -> NeighbourIndex:
    """The index saved in the checkpoint folder ``url``; :class:`CheckpointError` naming
    the file when it is missing, damaged or inconsistent.

    The model's ``n_features``, ``n_labels`` and last hidden ``width`` (None: not checked)
    are checked against the manifest before an array is read (the neighbours of another
    model are refused), and ``needs`` names the parts the model's settings rank with
    (``embedding``, ``label classifiers``, ``label trees``: :func:`model_expects`), so
    a manifest that lost one is refused rather than answering without it. The training
    rows' values and hidden vectors (unit rows) must lie in [-1, 1]. ``trees=False``: the
    label trees are left where they are saved (loaded in pieces: :func:`load_tree_pieces`)."""
    fs, root, where, found, entries = _manifest(url, storage_options, n_labels)
    _check_model(entries, where, n_features, width, set(needs or ()))
    if not trees:
        entries = {name: e for name, e in entries.items() if not name.startswith("tree")}
    arrays = _read(fs, root, entries)
    try:
        return NeighbourIndex.from_state(joined_trees(arrays), found)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None


def tree_pieces(url: str, storage_options: dict | None = None) -> int:
    """How many pieces the label trees of the index at ``url`` were saved in (0: whole,
    or none)."""
    entries = _manifest(url, storage_options, None)[4]
    return len({piece_of(name) for name in entries if is_piece(name)})


def load_tree_pieces(
    url: str,
    pieces: list[int],
    storage_options: dict | None = None,
    *,
    n_labels: int | None = None,
) -> tuple[tuple[LabelTree, ...], tuple[np.ndarray, ...]]:
    """The label trees of the index at ``url`` weighing only the nodes of saved
    ``pieces`` (the rest weightless), and those nodes, tree by tree: a worker's share of
    a model saved in pieces, loaded where it is asked (:class:`CheckpointError` as
    :func:`load_neighbours`)."""
    fs, root, where, found, entries = _manifest(url, storage_options, n_labels)
    n_features = entries["post_ptr"]["shape"][0] - 1 if entries["post_ptr"]["shape"] else 0
    out, nodes = [], []
    for t in range(len(TREE_ARRAYS)):
        prefix = tree_prefix(t)
        shape = {f"{prefix}_{name}" for name in SHAPE}
        if not shape <= set(entries):
            break
        mine = {n for n in entries if is_piece(n) and n.startswith(f"{prefix}_p")
                and piece_of(n) in pieces}  # fmt: skip
        arrays = _read(fs, root, {n: entries[n] for n in shape | mine})
        try:
            state, held = partial_tree(arrays, prefix)
            out.append(LabelTree.from_state(state, found, n_features))
        except ValueError as err:
            raise CheckpointError(f"{where}: {err}") from None
        nodes.append(held)
    return tuple(out), tuple(nodes)


def stored_bytes(url: str, storage_options: dict | None = None) -> dict[str, int]:
    """The stored bytes of each array of the index at ``url``, from its manifest alone."""
    entries = _manifest(url, storage_options, None)[4]
    return {name: int(entry["bytes"]) for name, entry in entries.items()}


def _manifest(url: str, storage_options: dict | None, n_labels: int | None):
    """The index folder's manifest, checked: (fs, root, where, n_labels, its entries)."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    folder = posixpath.join(root, FOLDER)
    where = fs.unstrip_protocol(posixpath.join(folder, MANIFEST))
    try:
        raw = read_small(
            fs, root, posixpath.join(folder, MANIFEST), MANIFEST_MAX_BYTES, "a manifest"
        )
        manifest = json.loads(raw)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: missing (the model was saved with neighbours)") from None
    except (ValueError, RecursionError) as err:
        raise CheckpointError(f"{where}: not a neighbour index manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not a neighbour index manifest")
    found, entries = manifest.get("n_labels"), manifest.get("arrays")
    if not isinstance(found, int) or not 1 <= found < 1 << 31:
        raise CheckpointError(f"{where}: n_labels must be a positive 32-bit integer")
    if n_labels is not None and found != n_labels:
        raise CheckpointError(f"{where}: an index of {found} labels, the model has {n_labels}")
    optional = {EMBEDDING, *CLASSIFIER_ARRAYS, *(key for tree in TREE_ARRAYS for key in tree)}
    if not isinstance(entries, dict) or {
        name for name in set(entries) - optional if not is_piece(name)
    } != set(ARRAYS):
        raise CheckpointError(
            f"{where}: arrays must be {sorted(ARRAYS)} (and {EMBEDDING}, the classifiers', "
            "the label trees')"
        )
    for name, entry in entries.items():
        check_entry(name, entry, where, None)
    return fs, root, where, found, entries


def _read(fs, root: str, entries: dict) -> dict[str, np.ndarray]:
    """The arrays of ``entries`` in the index folder, each checked against its entry."""
    folder = posixpath.join(root, FOLDER)
    arrays = {}
    for name, entry in entries.items():
        path = guard_read(fs, root, posixpath.join(folder, name + ".npy"))
        arrays[name] = read_array(fs, path, entry)
        if name in UNIT_VALUES:
            _check_unit(arrays[name], fs.unstrip_protocol(path), UNIT_VALUES[name])
    return arrays


#: Arrays of values in [-1, 1] (entries of unit rows), and what they are.
UNIT_VALUES = {
    "post_val": "the values of the L2-normalised training rows",
    EMBEDDING: "the L2-normalised hidden vectors",
}
#: Rounding a unit row's entries may exceed 1 by.
_UNIT_SLACK = 1e-4
#: Values checked at a time.
_PIECE = 1 << 22


def _check_unit(array, where: str, what: str) -> None:
    flat, step = array.reshape(-1), _PIECE  # in pieces: no copy of a whole array
    high = max(
        (float(np.abs(flat[i : i + step]).max()) for i in range(0, len(flat), step)), default=0.0
    )
    if high > 1.0 + _UNIT_SLACK:
        raise CheckpointError(f"{where}: values must be in [-1, 1] ({what}), found {high:.3g}")


def _check_model(entries: dict, where: str, n_features, width, needs: set[str]) -> None:
    """The index against the model it is loaded with, from the manifest's entries."""
    features = entries["post_ptr"]["shape"][0] - 1 if entries["post_ptr"]["shape"] else -1
    if n_features is not None and features != n_features:
        raise CheckpointError(
            f"{where}: an index of {features} features, the model has {n_features} "
            "(the neighbours of another model?)"
        )
    vectors = entries.get(EMBEDDING, {}).get("shape")
    if width is not None and vectors is not None and vectors[1:] != [width]:
        raise CheckpointError(
            f"{where}: hidden vectors of shape {vectors}, the model's last hidden layer is "
            f"{width} wide (the neighbours of another model?)"
        )
    parts = {
        EMBEDDING: ((EMBEDDING,), "neighbour_weight's hidden-space weight > 0"),
        "label classifiers": (tuple(CLASSIFIER_ARRAYS), "neighbour_weight's third > 0"),
        "label trees": (tuple(k for tree in TREE_ARRAYS for k in tree), "label_tree > 0"),
    }
    for part in sorted(needs):
        names, why = parts[part]
        if not any(name in entries for name in names):  # some: from_state names the rest
            raise CheckpointError(
                f"{where}: lists no {part}, which the model ranks with ({why} in meta.json)"
            )

"""A saved model's neighbour index: ``neighbours/`` beside the model's arrays.

Its own small manifest (``neighbours/index.json``) lists the arrays with their sizes and
checksums, read and checked as the model's are (no pickle, nothing outside the folder, a
bounded metadata read), so a model saved without an index loads as before.
"""

from __future__ import annotations

import json
import posixpath

import fsspec

from dslide_dask.checkpoint.arrays import CheckpointError, read_array, write_array
from dslide_dask.checkpoint.schema import check_entry
from dslide_dask.model.neighbours import (
    ARRAYS,
    CLASSIFIER_ARRAYS,
    EMBEDDING,
    TREE_ARRAYS,
    NeighbourIndex,
)
from dslide_dask.paths import guard_read, guard_write, read_small

FOLDER = "neighbours"
MANIFEST = "index.json"
FORMAT = "dslide-dask neighbour index"
MANIFEST_MAX_BYTES = 1 << 20


def save_neighbours(url: str, index: NeighbourIndex, storage_options: dict | None = None) -> None:
    """Write ``index`` into the checkpoint folder ``url``."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    folder = posixpath.join(root, FOLDER)
    guard_write(fs, root, folder)
    fs.makedirs(folder, exist_ok=True)
    arrays = {}
    for name, array in index.state().items():
        path = guard_write(fs, root, posixpath.join(folder, name + ".npy"))
        arrays[name] = write_array(fs, path, array)
    manifest = {"format": FORMAT, "n_labels": index.n_labels, "arrays": arrays}
    with fs.open(guard_write(fs, root, posixpath.join(folder, MANIFEST)), "w") as f:
        json.dump(manifest, f)


def load_neighbours(url: str, storage_options: dict | None = None) -> NeighbourIndex:
    """The index saved in the checkpoint folder ``url``; :class:`CheckpointError` naming
    the file when it is missing, damaged or inconsistent."""
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
    n_labels, entries = manifest.get("n_labels"), manifest.get("arrays")
    if not isinstance(n_labels, int) or not 1 <= n_labels < 1 << 31:
        raise CheckpointError(f"{where}: n_labels must be a positive 32-bit integer")
    optional = {EMBEDDING, *CLASSIFIER_ARRAYS, *(key for tree in TREE_ARRAYS for key in tree)}
    if not isinstance(entries, dict) or set(entries) - optional != set(ARRAYS):
        raise CheckpointError(
            f"{where}: arrays must be {sorted(ARRAYS)} (and {EMBEDDING}, the classifiers', "
            "the label trees')"
        )
    arrays = {}
    for name, entry in entries.items():
        check_entry(name, entry, where, None)
        path = guard_read(fs, root, posixpath.join(folder, name + ".npy"))
        arrays[name] = read_array(fs, path, entry)
    try:
        return NeighbourIndex.from_state(arrays, n_labels)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None

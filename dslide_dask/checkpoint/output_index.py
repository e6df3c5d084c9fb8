"""A saved model's output index: ``output_index/`` beside the model's arrays.

As the neighbour index (:mod:`.neighbours`): its own small manifest
(``output_index/index.json``) lists its arrays, faiss's serialisation of the index as a
``.npy`` of bytes and the ids of the head rows, with their sizes, CRC32 and sha256, all
checked before faiss reads a byte (faiss's reader does not notice a flipped byte);
nothing outside the folder is read, and no pickle. The manifest also keeps the
fingerprint of the model it was built for: a sha256 of the checkpoint's output-layer
entries (sizes and CRC32 of every shard's weights and biases, and the layout), so an
index copied beside another model, or left beside a model trained on, is refused by name
before its bytes are read, from the model's metadata alone (a client checks it without
loading any weights).

A model saved without an index loads as before; ``dslide index MODEL`` adds one to a
saved model afterwards (the model's own files are not touched).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath

import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError, read_array, write_array
from dslide_dask.checkpoint.schema import check_entry
from dslide_dask.checkpoint.store import Checkpoint
from dslide_dask.model.output_index import IndexSettings, OutputIndex, faiss_module
from dslide_dask.paths import guard_read, guard_write, read_small

FOLDER = "output_index"
MANIFEST = "index.json"
#: The arrays of an index, with their dtypes (``.npy`` files of the same names).
ARRAYS = {"faiss": "|u1", "head": "<i8"}
FORMAT = "dslide-dask output index"
VERSION = 1
MANIFEST_MAX_BYTES = 1 << 20


def model_fingerprint(meta: dict) -> str:
    """sha256 of what a checkpoint's metadata says of its output layer: the layout and
    the entries (bytes, CRC32, dtype, shape) of every shard's ``W`` and ``bias``."""
    arrays = meta["arrays"]
    layer = [
        arrays.get(f"shard-{i:04d}/{name}")
        for i in range(len(meta["shards"]))
        for name in ("W", "bias")
    ]
    text = json.dumps([meta["layout"], layer], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(ckpt: Checkpoint, name: str) -> str:
    return posixpath.join(ckpt.path, FOLDER, name)


def has_output_index(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint holds an output index (its manifest)."""
    return ckpt.fs.exists(_path(ckpt, MANIFEST))


def save_output_index(ckpt: Checkpoint, index: OutputIndex) -> str:
    """Write ``index`` (built from the weights of ``ckpt``) into the checkpoint's folder,
    replacing one there (its manifest goes first: a write cut short leaves no index, not
    a damaged one); returns the manifest's URL."""
    fs, root = ckpt.fs, ckpt.path
    manifest = _path(ckpt, MANIFEST)
    guard_write(fs, root, posixpath.dirname(manifest))
    fs.makedirs(posixpath.dirname(manifest), exist_ok=True)
    if fs.exists(guard_write(fs, root, manifest)):
        fs.rm(manifest)
    entries = {}
    for name, array in (("faiss", index.to_bytes()), ("head", index.head)):
        array = np.ascontiguousarray(array)
        entries[name] = write_array(fs, guard_write(fs, root, _path(ckpt, name + ".npy")), array)
        entries[name]["sha256"] = hashlib.sha256(array.data).hexdigest()
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "n_labels": index.n_labels,
        "dim": index.dim,
        "settings": dataclasses.asdict(index.settings),
        "model": model_fingerprint(ckpt.meta),
        "arrays": entries,
    }
    with fs.open(manifest, "w") as f:
        json.dump(meta, f)
    return fs.unstrip_protocol(manifest)


def _manifest(ckpt: Checkpoint) -> tuple[dict, str]:
    """The output index's manifest (format and version checked) and where it is."""
    manifest_path = _path(ckpt, MANIFEST)
    where = ckpt.fs.unstrip_protocol(manifest_path)
    try:
        raw = read_small(ckpt.fs, ckpt.path, manifest_path, MANIFEST_MAX_BYTES, "a manifest")
        meta = json.loads(raw)
    except FileNotFoundError:
        raise CheckpointError(
            f"{where}: missing (no output index: build one with `dslide index MODEL` or "
            "SlideClassifier.build_index)"
        ) from None
    except (ValueError, RecursionError) as err:
        raise CheckpointError(f"{where}: not an output index manifest ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an output index manifest")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{where}: version {meta.get('version')!r}, this reads {VERSION}")
    return meta, where


def output_index_bytes(ckpt: Checkpoint) -> int:
    """The stored bytes of the checkpoint's output index, from its manifest alone."""
    meta, where = _manifest(ckpt)
    entries = meta.get("arrays")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{where}: arrays must be {sorted(ARRAYS)}")
    for name, entry in entries.items():
        check_entry(name, entry, where, None)
    return sum(int(entry["bytes"]) for entry in entries.values())


def check_output_index(ckpt: Checkpoint) -> tuple[IndexSettings, dict[str, np.ndarray]]:
    """The settings and arrays of the checkpoint's output index, once the manifest, the
    model's fingerprint, the files' sizes, CRC32 and sha256 are checked (faiss has not
    read them yet); :class:`CheckpointError` naming the file otherwise."""
    fs, root = ckpt.fs, ckpt.path
    meta, where = _manifest(ckpt)
    if meta.get("model") != model_fingerprint(ckpt.meta):  # before a byte of the index
        raise CheckpointError(
            f"{where}: built for another model than the one here (a foreign index, or the "
            "model changed since): build it again with `dslide index MODEL`"
        )
    n_labels, dim = ckpt.meta["n_labels"], ckpt.meta["config"]["hidden"][-1]
    if meta.get("n_labels") != n_labels or meta.get("dim") != dim:
        raise CheckpointError(f"{where}: n_labels and dim must be the model's")
    try:
        raw_settings = meta.get("settings")
        if not isinstance(raw_settings, dict):
            raise TypeError(f"not a mapping: {raw_settings!r:.60}")
        settings = IndexSettings.of(raw_settings)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: settings: {err}") from None
    if settings.lists < 1:  # saved as built: chosen for the layer's size, never 0
        raise CheckpointError(f"{where}: settings: lists must be at least 1")
    if not 1 <= settings.probes <= settings.lists:
        raise CheckpointError(
            f"{where}: settings: probes must be in [1, {settings.lists}] (the lists), "
            f"got {settings.probes}"
        )
    entries = meta.get("arrays")
    if not isinstance(entries, dict) or set(entries) != set(ARRAYS):
        raise CheckpointError(f"{where}: arrays must be {sorted(ARRAYS)}")
    arrays = {}
    for name, dtype in ARRAYS.items():
        entry = entries[name]
        check_entry(name, entry, where, None)
        if entry["dtype"] != dtype or len(entry["shape"]) != 1:
            raise CheckpointError(f"{where}: {name} must be 1-D {dtype}")
        path = guard_read(fs, root, _path(ckpt, name + ".npy"))
        arrays[name] = read_array(fs, path, entry)
        if hashlib.sha256(arrays[name].data).hexdigest() != entry.get("sha256"):
            raise CheckpointError(f"{fs.unstrip_protocol(path)}: sha256 mismatch (corrupted)")
    return settings, arrays


def load_output_index(ckpt: Checkpoint) -> OutputIndex:
    """The checkpoint's output index, checked (:func:`check_output_index`) and read; its
    lists, and the centroids of its quantizer, must be those the manifest says."""
    settings, arrays = check_output_index(ckpt)
    n_labels, dim = ckpt.meta["n_labels"], ckpt.meta["config"]["hidden"][-1]
    where = ckpt.fs.unstrip_protocol(_path(ckpt, "faiss.npy"))
    try:
        index = OutputIndex.from_bytes(arrays["faiss"], arrays["head"], settings, n_labels, dim)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    ivf = faiss_module().try_extract_index_ivf(index.index)
    if not ivf.nlist == ivf.quantizer.ntotal == settings.lists:  # else faiss fails searching
        raise CheckpointError(
            f"{where}: {ivf.nlist} lists but {ivf.quantizer.ntotal} centroids, the manifest "
            f"says {settings.lists} lists"
        )
    return index

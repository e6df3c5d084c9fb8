"""The format of batch predictions: a folder of per-partition ``.npz`` files.

``part-000000.npz`` ... each hold ``ids`` (int64 ``[rows, k]``, label ids best first, -1
where fewer than k were found) and ``scores`` (float32 ``[rows, k]``, the logits) of one
input partition, in input order. ``predictions.json``, written last, lists them::

    {"format": "dslide-predictions", "version": 1, "k": 5, "n_points": ...,
     "parts": [{"file": "part-000000.npz", "n_points": ...}, ...], "model": ..., ...}

Why npz (as the converted layout's chunks): one GET a part, opened by ``np.load``
anywhere, no new dependency; Parquet would need pyarrow for two fixed-width columns.
:func:`read_predictions` reads it all back in one call. With a
``filter_labels_test.txt``'s pairs left out, the manifest also holds ``filter_labels`` and
``left_out`` (the pairs' count).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
from collections.abc import Iterator

import fsspec
import numpy as np

from dslide_dask.paths import guard_read, guard_write, inside, is_local, read_small

FORMAT = "dslide-predictions"
VERSION = 1
MANIFEST = "predictions.json"
#: Largest predictions.json read (a few hundred bytes a partition).
MANIFEST_MAX_BYTES = 64 << 20
#: What :func:`write_manifest` writes of its own (the rest is the caller's ``info``).
_OWN = ("format", "version", "n_points", "parts")


def part_name(index: int) -> str:
    return f"part-{index:06d}.npz"


def check_output(url: str, n_parts: int, storage_options: dict) -> None:
    """Before any work: no file the output will hold (parts, manifest) is a link, which
    would send the writes out of the folder (:func:`dslide_dask.paths.guard_write`), and
    the folder takes a file: a probe is written and removed (a read-only folder or store
    would otherwise fail in every task, each printing a worker's traceback). A folder
    made for the probe is removed with it."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    for name in [MANIFEST, *(part_name(i) for i in range(n_parts))]:
        guard_write(fs, path, posixpath.join(path, name))
    if fs.isfile(path):  # as clear_manifest says it, but before a cluster starts
        raise ValueError(f"{url}: a file exists there: the predictions go into a folder")
    probe = guard_write(fs, path, posixpath.join(path, f".dslide-probe-{os.urandom(6).hex()}"))
    made = []  # local folders the probe made, deepest first
    if is_local(fs):
        folder = path.rstrip("/")
        while folder and not os.path.lexists(folder):
            made.append(folder)
            folder = posixpath.dirname(folder)
    try:
        fs.makedirs(path, exist_ok=True)
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except OSError as err:
        raise type(err)(err.errno, err.strerror or str(err), url) from None
    finally:
        for folder in made:
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def write_part(url: str, index: int, arrays: tuple, storage_options: dict) -> dict:
    """Write one partition's ``(ids, scores)`` under folder ``url``; its manifest entry."""
    ids, scores = arrays
    buf = io.BytesIO()
    np.savez(buf, ids=np.asarray(ids, np.int64), scores=np.asarray(scores, np.float32))
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    fs.makedirs(path, exist_ok=True)
    with fs.open(guard_write(fs, path, posixpath.join(path, part_name(index))), "wb") as f:
        f.write(buf.getvalue())
    return {"file": part_name(index), "n_points": int(len(ids))}


def clear_manifest(url: str, storage_options: dict) -> None:
    """Remove an older run's ``predictions.json`` first: until the new one is written,
    the folder must not look complete (its parts are being replaced). An existing file
    at ``url`` is refused here, before any task starts (each would fail on it)."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    if fs.isfile(path):
        raise ValueError(f"{url}: a file exists there: the predictions go into a folder")
    target = guard_write(fs, path, posixpath.join(path, MANIFEST))
    if fs.exists(target):
        fs.rm(target)


def write_manifest(url: str, parts: list[dict], info: dict, storage_options: dict) -> dict:
    """Write ``predictions.json`` (last: its presence means the output is complete)."""
    meta = {
        "format": FORMAT,
        "version": VERSION,
        **info,
        "n_points": sum(p["n_points"] for p in parts),
        "parts": parts,
    }
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    with fs.open(guard_write(fs, path, posixpath.join(path, MANIFEST)), "w") as f:
        json.dump(meta, f)
    return meta


def read_predictions(
    url: str, storage_options: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, scores)`` of every row of a prediction folder, in input order: only files
    inside the folder (the manifest's part names are data, as are links in the folder)."""
    parts = list(iter_predictions(url, storage_options))
    if not parts:
        k = _manifest(url, storage_options)[3]
        return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _manifest(url: str, storage_options: dict | None) -> tuple:
    """``(fs, path, where, k, parts, meta)`` of a prediction folder's manifest, checked."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    where = fs.unstrip_protocol(posixpath.join(path, MANIFEST))
    try:
        raw = read_small(fs, path, posixpath.join(path, MANIFEST), MANIFEST_MAX_BYTES, MANIFEST)
        meta = json.loads(raw)
    except FileNotFoundError:
        raise ValueError(f"{where}: not found (no predictions here, or not complete)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid JSON (nested too deeply)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{where}: not a {FORMAT} manifest")
    k, parts = meta.get("k"), meta.get("parts")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{where}: k must be a positive integer, got {k!r}")
    if not isinstance(parts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("n_points"), int) for p in parts
    ):
        raise ValueError(f"{where}: parts must be a list of {{file, n_points}} entries")
    return fs, path, where, k, parts, meta


def iter_predictions(
    url: str, storage_options: dict | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(ids, scores)`` of each part of a prediction folder in input order, one part
    read at a time (:func:`~dslide_dask.inference.read_predictions` reads them all). The
    manifest is read at the call, the parts as they are asked for."""
    return _parts(*_manifest(url, storage_options)[:5])


def _parts(
    fs, path: str, where: str, k: int, parts: list
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for entry in parts:
        name = guard_read(fs, path, inside(path, entry.get("file"), where))
        try:
            raw = fs.cat_file(name)
        except FileNotFoundError:
            raise ValueError(f"{fs.unstrip_protocol(name)}: missing (listed in {where})") from None
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                ids, scores = np.asarray(z["ids"]), np.asarray(z["scores"])
        except (ValueError, KeyError, OSError) as err:
            raise ValueError(
                f"{fs.unstrip_protocol(name)}: not a prediction part ({type(err).__name__})"
            ) from None
        if ids.shape != (entry["n_points"], k) or scores.shape != ids.shape:
            raise ValueError(
                f"{fs.unstrip_protocol(name)}: {ids.shape} ids and {scores.shape} scores, "
                f"the manifest says ({entry['n_points']}, {k})"
            )
        yield ids, scores

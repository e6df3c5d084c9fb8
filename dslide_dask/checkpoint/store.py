"""A folder of checkpoints on any fsspec URL, committed atomically.

Layout::

    ROOT/LATEST                       name of the newest complete checkpoint
    ROOT/step-00001200-3fa9c1d2/      one checkpoint
        meta.json                     config, sizes, step, data position, array entries
        hidden/W0.npy ...             hidden layers (weights, biases, Adam moments)
        hidden-0000/W0.npy ...        or, split by units, each holder's units
        shard-0000/W.npy ...          one folder per shard of the wide layer

A checkpoint is written into a fresh folder (a random suffix: never over an existing
one); ``meta.json`` is written after every array (a model's fused parts included) and
``LATEST`` after ``meta.json`` (a single small write: atomic on object stores, a rename
on local disks), and only then are older checkpoints pruned. A crash at any moment
therefore leaves ``LATEST`` naming the previous, complete checkpoint; folders that were
never committed are ignored and removed by the next commit's pruning. Two processes
saving a model to one local folder take turns (:meth:`CheckpointStore.saving`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import posixpath
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from dslide_dask.checkpoint.arrays import CheckpointError, read_array, write_array
from dslide_dask.checkpoint.schema import check_meta
from dslide_dask.paths import guard_read, guard_write, inside, read_small

FORMAT = "dslide-checkpoint"
VERSION = 1
LATEST = "LATEST"
META = "meta.json"
#: Largest meta.json read (a big model's is a few kB: one entry per array).
META_MAX_BYTES = 16 << 20
#: Largest LATEST read (a checkpoint folder's name).
LATEST_MAX_BYTES = 4096
#: The file a save holds locked on a local disk while it writes and commits.
SAVE_LOCK = ".saving"


@dataclass
class Folder:
    """A folder on a file system that arrays are written to."""

    fs: fsspec.AbstractFileSystem
    path: str

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None) -> Folder:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
        return cls(fs, path)

    def write(self, name: str, array: np.ndarray) -> dict:
        """Write array ``name`` (e.g. ``"shard-0001/W"``); its metadata entry."""
        path = guard_write(self.fs, self.path, posixpath.join(self.path, name + ".npy"))
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        return write_array(self.fs, path, array)

    @property
    def url(self) -> str:
        return self.fs.unstrip_protocol(self.path)


@dataclass
class Checkpoint:
    """A committed checkpoint: its metadata, and its arrays read (and checked) on demand."""

    fs: fsspec.AbstractFileSystem
    path: str
    meta: dict

    @property
    def url(self) -> str:
        return self.fs.unstrip_protocol(self.path)

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    def has(self, name: str) -> bool:
        return name in self.meta["arrays"]

    def read(self, name: str) -> np.ndarray:
        entry = self.meta["arrays"].get(name)
        if entry is None:
            raise CheckpointError(f"{self.url}: no array {name!r} in {META}")
        path = guard_read(self.fs, self.path, posixpath.join(self.path, name + ".npy"))
        return read_array(self.fs, path, entry)


class CheckpointStore:
    """Checkpoints under ``url``; keeps the newest ``keep`` (0: all)."""

    def __init__(self, url: str, storage_options: dict | None = None, keep: int = 3) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0 (0: keep all), got {keep}")
        self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.keep = keep

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Held around a whole save (arrays, fused parts, commit, pruning): on a local
        disk a second process saving to the same folder waits its turn, so neither
        prunes the other's folder mid-write. Object stores have no lock: there the last
        commit wins and pruning never removes the checkpoint ``LATEST`` names."""
        if not isinstance(self.fs, LocalFileSystem):
            yield
            return
        self.fs.makedirs(self.root, exist_ok=True)
        path = guard_write(self.fs, self.root, posixpath.join(self.root, SAVE_LOCK))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def new_folder(self, step: int) -> Folder:
        """A fresh, empty folder for the checkpoint of ``step``."""
        name = f"step-{step:08d}-{uuid.uuid4().hex[:8]}"
        path = guard_write(self.fs, self.root, posixpath.join(self.root, name))
        self.fs.makedirs(path, exist_ok=True)
        return Folder(self.fs, path)

    def commit(self, folder: Folder, meta: dict) -> Checkpoint:
        """Make ``folder`` (all arrays written) the latest checkpoint, then prune."""
        meta = {"format": FORMAT, "version": VERSION, "created": time.time(), **meta}
        meta_path = guard_write(self.fs, folder.path, posixpath.join(folder.path, META))
        with self.fs.open(meta_path, "w") as f:
            json.dump(meta, f)
        self._write_latest(posixpath.basename(folder.path))
        self._prune(keep_name=posixpath.basename(folder.path))
        return Checkpoint(self.fs, folder.path, meta)

    def _write_latest(self, name: str) -> None:
        target = guard_write(self.fs, self.root, posixpath.join(self.root, LATEST))
        if isinstance(self.fs, LocalFileSystem):
            tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
            self.fs.pipe_file(tmp, name.encode())
            self.fs.mv(tmp, target)  # a rename: atomic on one file system
        else:
            self.fs.pipe_file(target, name.encode())  # one PUT: atomic on object stores

    def _latest_name(self) -> str | None:
        try:
            return posixpath.basename(_follow_latest(self.fs, self.root))
        except (OSError, ValueError):  # none yet, or unreadable: nothing to spare
            return None

    def latest(self) -> Checkpoint | None:
        """The newest committed checkpoint, or None when there is none yet."""
        latest = posixpath.join(self.root, LATEST)
        if not self.fs.exists(latest):
            return None
        path = _follow_latest(self.fs, self.root)
        return open_checkpoint(self.fs.unstrip_protocol(path), self.storage_options)

    def list(self) -> list[str]:
        """Names of the checkpoint folders present, oldest first (committed or not)."""
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in entries]
        return sorted(n for n in names if n.startswith("step-"))

    def _prune(self, keep_name: str) -> None:
        """Remove uncommitted folders and all but the newest ``keep`` committed ones,
        never the one ``LATEST`` names now (another saver's, committed since ours)."""
        kept = {keep_name, self._latest_name()}
        names = [n for n in self.list() if n not in kept]
        committed = [n for n in names if self.fs.exists(posixpath.join(self.root, n, META))]
        doomed = [n for n in names if n not in committed]
        if self.keep:
            doomed += committed[: max(0, len(committed) - (self.keep - 1))]
        for name in doomed:  # a link is refused: what it leads to is not ours to remove
            path = guard_write(self.fs, self.root, posixpath.join(self.root, name))
            self.fs.rm(path, recursive=True)


def open_checkpoint(url: str, storage_options: dict | None = None) -> Checkpoint:
    """The checkpoint at ``url``, its arrays checked against sizes and checksums as read.

    Parameters
    ----------
    url : str
        A checkpoint folder, or a store (or run folder) whose latest checkpoint is
        taken, on any fsspec URL.
    storage_options : dict or None, default=None
        fsspec options of ``url``.

    Returns
    -------
    Checkpoint
        Its metadata (``meta``) and its arrays, read on demand.

    Raises
    ------
    CheckpointError
        Saying what is missing or wrong.
    """
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    for candidate in (path, posixpath.join(path, "checkpoints")):
        if fs.exists(posixpath.join(candidate, LATEST)):
            path = _follow_latest(fs, candidate)
            break
    meta_path = posixpath.join(path, META)
    where = fs.unstrip_protocol(meta_path)
    try:
        meta = json.loads(read_small(fs, path, meta_path, META_MAX_BYTES, "checkpoint metadata"))
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"{url}: no checkpoint here ({META} or {LATEST} not found)") from None
    except IsADirectoryError:
        raise CheckpointError(f"{where}: a folder, not a file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{where}: not valid JSON ({err})") from None
    except RecursionError:
        raise CheckpointError(f"{where}: not valid checkpoint JSON (nested too deeply)") from None
    _check_format(meta, where)
    check_meta(meta, where, _array_sizes(fs, path))
    return Checkpoint(fs, path, meta)


def _follow_latest(fs, root: str) -> str:
    """The checkpoint folder ``root/LATEST`` names: a folder inside ``root``, nowhere else."""
    where = fs.unstrip_protocol(posixpath.join(root, LATEST))
    raw = read_small(fs, root, posixpath.join(root, LATEST), LATEST_MAX_BYTES, "a checkpoint name")
    try:
        name = raw.decode().strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{where}: not a checkpoint name") from None
    path = inside(root, name, where)
    if posixpath.dirname(path) != root.rstrip("/"):
        raise CheckpointError(f"{where}: {name!r} is not a checkpoint folder of {root}")
    return path


def _array_sizes(fs, path: str) -> dict[str, int]:
    """Array name -> bytes of the ``.npy`` files under a checkpoint folder."""
    out = {}
    for name, info in fs.find(path, detail=True).items():
        rel = name[len(path.rstrip("/")) + 1 :] if name.startswith(path.rstrip("/")) else name
        if rel.endswith(".npy"):
            out[rel[: -len(".npy")]] = int(info.get("size") or 0)
    return out


def _check_format(meta, where: str) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not a dslide-dask checkpoint")
    if meta.get("version") != VERSION:
        raise CheckpointError(
            f"{where}: checkpoint format version {meta.get('version')}, this dslide-dask "
            f"reads version {VERSION}"
        )

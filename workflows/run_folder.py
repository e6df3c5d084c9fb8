"""The run folder every ``dslide train`` writes, on any fsspec URL.

::

    RUN/config.yaml       the resolved settings and model parameters (secrets masked)
    RUN/metrics.jsonl     one JSON object a line: {"kind": "step", ...} or {"kind": "eval", ...}
    RUN/curves.png        loss and P@k against steps
    RUN/checkpoints/      periodic checkpoints (--checkpoint-every / --checkpoint-minutes)
    RUN/model/            the final model (SlideClassifier.load / --resume read it)
    RUN/summary.json      the run summary; summary.txt the same as printed
    RUN/run.json          the marker: this folder is a dslide run (written first)
    RUN/run.lock          while a run writes the folder (:mod:`dslide_workflows.run_lock`)

Object stores cannot append, so metrics are kept in memory and the whole file is
rewritten now and then (at most every ``FLUSH_SECONDS``, at evaluations, at the end).

A run writes only into a folder that is new, empty or a run folder (its marker), holding
the lock, and never through a symbolic link: every local path goes through
:mod:`dslide_dask.paths`, and small files are read up to a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import time
from typing import Any

import fsspec
import yaml

from dslide_dask.paths import check_tree, inside, is_local, read_small, write_file
from dslide_workflows.metrics_log import parse_metrics
from dslide_workflows.run_lock import LOCK, RunLock
from dslide_workflows.secrets import mask
from dslide_workflows.settings import parse_yaml

FLUSH_SECONDS = 30.0
MARKER, MARKER_FORMAT = "run.json", "dslide-run"
#: Bounds of the files read back: settings and summaries are a few kB.
TEXT_MAX_BYTES, METRICS_MAX_BYTES = 4 << 20, 1 << 30


class RunFolder:
    """Reads and writes the files of one run under ``url``."""

    def __init__(self, url: str, storage_options: dict | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.records: list[dict] = []
        self._flushed = time.monotonic()

    def path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def child_url(self, name: str) -> str:
        """URL of a file or folder in the run (for checkpoints, the model)."""
        return f"{self.url}/{name}"

    def exists(self) -> bool:
        return self.fs.exists(self.path("config.yaml"))

    def is_run(self) -> bool:
        """Whether the folder holds the marker a run writes first."""
        try:
            raw = read_small(self.fs, self.root, self.path(MARKER), 4096, "a run marker")
            return json.loads(raw).get("format") == MARKER_FORMAT
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return False
        except (ValueError, AttributeError, RecursionError):  # not JSON, not an object
            return False

    @contextlib.contextmanager
    def claimed(self, resume: bool):
        """Hold the folder for one run: a new run's must be missing, empty or a run
        folder; on a local disk the lock is taken (and the folder checked for links and
        special files, under the lock); at the end the lock goes, and a folder made for
        a run that wrote nothing goes too."""
        if not resume:
            self._check_new()
        lock = None
        made = is_local(self.fs) and not os.path.exists(self.root)
        if is_local(self.fs):
            self.fs.makedirs(self.root, exist_ok=True)
            lock = RunLock(self.fs, self.root, self.url)
        try:
            if lock is not None:
                lock.acquire()
            if not resume:
                self._check_new()  # again: another run may have written it meanwhile
            check_tree(self.fs, self.root)
            yield self
        finally:
            if lock is not None:
                lock.release()
            if made:
                with contextlib.suppress(OSError):
                    os.rmdir(self.root)  # only if empty

    def _check_new(self) -> None:
        """A new run goes into a missing or empty folder, or a run folder (one a failed
        run left): never over someone's other files."""
        if self.fs.isfile(self.root):
            raise ValueError(f"--run-dir {self.url}: a file, not a folder")
        try:
            names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, False)]
        except FileNotFoundError:
            return
        if [n for n in names if n != LOCK] and not self.is_run():
            raise ValueError(
                f"--run-dir {self.url}: holds other files and is not a dslide run folder "
                f"(no {MARKER}): choose a new or empty folder"
            )

    def resumable(self) -> bool:
        """Whether the run has something to carry on from (a checkpoint or final model)."""
        return any(self.fs.exists(self.path(f"{d}/LATEST")) for d in ("checkpoints", "model"))

    def own_file(self, ref: str, where: str) -> str:
        """``ref`` (a local path read from the run's own files) if it is inside this
        folder, symbolic links followed; else a ValueError: a resumed run writes nowhere
        else."""
        if "file" in self.fs.protocol and isinstance(ref, str) and "://" not in ref:
            real = os.path.realpath(ref)
            rel = os.path.relpath(real, os.path.realpath(self.root))
            with contextlib.suppress(ValueError):
                inside(self.root, rel, where)
                return real
        raise ValueError(
            f"{where}: performance_report {ref!r} is outside the run folder {self.url}: "
            "give --performance-report to say where the resumed run's report goes"
        )

    # -- writing -------------------------------------------------------------------------
    def write_config(self, settings: dict[str, Any]) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        if not self.is_run():
            marker = {"format": MARKER_FORMAT, "version": 1, "created": time.time()}
            self._write_bytes(MARKER, json.dumps(marker).encode())
        self._write_text("config.yaml", yaml.safe_dump(mask(settings), sort_keys=False))

    def add(self, kind: str, record: dict) -> None:
        """Keep a metrics record (``kind`` "step" or "eval"); flush now and then."""
        self.records.append({"kind": kind, **record})
        if kind == "eval" or time.monotonic() - self._flushed > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        lines = "".join(json.dumps(r, default=float) + "\n" for r in self.records)
        self._write_text("metrics.jsonl", lines)
        self._flushed = time.monotonic()

    def write_summary(self, summary: dict, text: str) -> None:
        self._write_text("summary.json", json.dumps(mask(summary), indent=2, default=float))
        self._write_text("summary.txt", text + "\n")

    def write_plot(self, png: bytes) -> None:
        self._write_bytes("curves.png", png)

    def _write_text(self, name: str, text: str) -> None:
        self._write_bytes(name, text.encode())

    def _write_bytes(self, name: str, data: bytes) -> None:
        write_file(self.fs, self.root, self.path(name), data)

    # -- reading -------------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        where = self.child_url("config.yaml")
        try:
            raw = self._read("config.yaml", TEXT_MAX_BYTES, "a run's settings")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise FileNotFoundError(f"{self.url}: not a run folder (no config.yaml)") from None
        saved = parse_yaml(raw, where) or {}
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: expected a mapping of settings")
        return saved

    def read_metrics(self) -> list[dict]:
        """The metrics records written so far (a line that is not one is named)."""
        try:
            text = self._read("metrics.jsonl", METRICS_MAX_BYTES, "metrics").decode()
        except FileNotFoundError:
            return []
        return parse_metrics(text, f"{self.url}/metrics.jsonl")  # each record checked

    def read_summary(self) -> str | None:
        """summary.txt as printed, or None before the run finished."""
        try:
            return self._read("summary.txt", TEXT_MAX_BYTES, "a summary").decode()
        except FileNotFoundError:
            return None

    def _read(self, name: str, limit: int, what: str) -> bytes:
        return read_small(self.fs, self.root, self.path(name), limit, what)

"""The run folder every ``dslide train`` writes, on any fsspec URL.

::

    RUN/config.yaml       the resolved settings and model parameters (secrets masked)
    RUN/metrics.jsonl     one JSON object a line: {"kind": "step", ...} or {"kind": "eval", ...}
    RUN/curves.png        loss and P@k against steps
    RUN/checkpoints/      periodic checkpoints (--checkpoint-every / --checkpoint-minutes)
    RUN/model/            the final model (SlideClassifier.load / --resume read it)
    RUN/summary.json      the run summary; summary.txt the same as printed

Object stores cannot append, so metrics are kept in memory and the whole file is
rewritten now and then (at most every ``FLUSH_SECONDS``, at evaluations, at the end).
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

from dslide_dask.paths import inside
from dslide_workflows.secrets import mask
from dslide_workflows.settings import parse_yaml

FLUSH_SECONDS = 30.0


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
        self.fs.pipe_file(self.path("curves.png"), png)

    def _write_text(self, name: str, text: str) -> None:
        with self.fs.open(self.path(name), "w") as f:
            f.write(text)

    # -- reading -------------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        where = self.child_url("config.yaml")
        try:
            raw = self.fs.cat_file(self.path("config.yaml"))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise FileNotFoundError(f"{self.url}: not a run folder (no config.yaml)") from None
        saved = parse_yaml(raw, where) or {}
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: expected a mapping of settings")
        return saved

    def read_metrics(self) -> list[dict]:
        """The metrics records written so far (a line that is not JSON is named)."""
        try:
            text = self.fs.cat_file(self.path("metrics.jsonl")).decode()
        except FileNotFoundError:
            return []
        out = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(
                        f"{self.url}/metrics.jsonl:{number}: not JSON ({err})"
                    ) from None
        return out

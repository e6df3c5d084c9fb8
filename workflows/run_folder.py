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

import json
import posixpath
import time
from typing import Any

import fsspec
import yaml

FLUSH_SECONDS = 30.0
#: storage_options keys whose values are not written down.
SECRET_WORDS = ("key", "secret", "token", "password", "credential")
MASKED = "***"


def mask_secrets(options: dict) -> dict:
    """``options`` with the values of secret-looking keys replaced by ``"***"``."""
    return {
        k: MASKED if any(w in k.lower() for w in SECRET_WORDS) else v for k, v in options.items()
    }


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

    # -- writing -------------------------------------------------------------------------
    def write_config(self, settings: dict[str, Any]) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        settings = {**settings, "storage_options": mask_secrets(settings["storage_options"])}
        self._write_text("config.yaml", yaml.safe_dump(settings, sort_keys=False))

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
        self._write_text("summary.json", json.dumps(summary, indent=2, default=float))
        self._write_text("summary.txt", text + "\n")

    def write_plot(self, png: bytes) -> None:
        self.fs.pipe_file(self.path("curves.png"), png)

    def _write_text(self, name: str, text: str) -> None:
        with self.fs.open(self.path(name), "w") as f:
            f.write(text)

    # -- reading -------------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        try:
            return yaml.safe_load(self.fs.cat_file(self.path("config.yaml"))) or {}
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.url}: not a run folder (no config.yaml)") from None

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

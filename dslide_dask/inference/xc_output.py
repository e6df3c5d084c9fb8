"""Batch predictions as the text users' XC tools write: one line a row, ``label:score``
pairs best first (napkinXC's and the XC repository's score files), labels not found left
out.

Converted on the client from the parts the workers wrote (:mod:`.output`), one part in
memory at a time, so a prediction of any size converts in the memory of its largest
part. (Writing text from the tasks themselves would be a second format for every task to
know; the ``.npz`` parts stay the one the graph writes.)
"""

from __future__ import annotations

import posixpath

import fsspec
import numpy as np

from dslide_dask.inference.output import iter_predictions
from dslide_dask.paths import guard_write

#: The text file ``dslide predict --format xc`` writes into the output folder.
TEXT_NAME = "predictions.txt"


def format_rows(ids: np.ndarray, scores: np.ndarray) -> str:
    """Rows as ``label:score ...`` lines (scores to 6 significant digits; ids < 0, not
    found, left out: an empty line for a row with none)."""
    lines = []
    for row_ids, row_scores in zip(ids.tolist(), scores.tolist(), strict=True):
        pairs = zip(row_ids, row_scores, strict=True)
        lines.append(" ".join(f"{i}:{s:.6g}" for i, s in pairs if i >= 0))
    return "\n".join(lines) + "\n" if lines else ""


def write_xc_predictions(
    url: str, storage_options: dict | None = None, name: str = TEXT_NAME
) -> tuple[str, int]:
    """Write the predictions of the folder ``url`` as XC text into ``url/name``, part by
    part; ``(the text file's URL, rows written)``."""
    so = storage_options or {}
    fs, path = fsspec.core.url_to_fs(url, **so)
    target = guard_write(fs, path, posixpath.join(path, name))
    rows = 0
    with fs.open(target, "w", encoding="utf-8") as f:
        for ids, scores in iter_predictions(url, so):
            f.write(format_rows(ids, scores))
            rows += len(ids)
    return fs.unstrip_protocol(target), rows

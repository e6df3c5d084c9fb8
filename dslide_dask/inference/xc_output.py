"""Batch predictions as the text users' XC tools write: one line a row, ``label:score``
pairs best first (napkinXC's and the XC repository's score files), labels not found left
out.

Converted on the client from the parts the workers wrote (:mod:`.output`), one part in
memory at a time, so a prediction of any size converts in the memory of its largest
part. (Writing text from the tasks themselves would be a second format for every task to
know; the ``.npz`` parts stay the one the graph writes.)
"""

from __future__ import annotations

import io
import json
import posixpath
from collections.abc import Iterator

import fsspec
import numpy as np

from dslide_dask.inference.output import FORMAT, MANIFEST, MANIFEST_MAX_BYTES
from dslide_dask.paths import guard_read, guard_write, inside, read_small

#: The text file ``dslide predict --format xc`` writes into the output folder.
TEXT_NAME = "predictions.txt"


def iter_predictions(
    url: str, storage_options: dict | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(ids, scores)`` of each part of a prediction folder in input order, one part
    read at a time (:func:`~dslide_dask.inference.read_predictions` reads them all)."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    where = fs.unstrip_protocol(posixpath.join(path, MANIFEST))
    try:
        raw = read_small(fs, path, posixpath.join(path, MANIFEST), MANIFEST_MAX_BYTES, MANIFEST)
        meta = json.loads(raw)
    except FileNotFoundError:
        raise ValueError(f"{where}: not found (no predictions here, or not complete)") from None
    except (ValueError, RecursionError) as err:  # JSON or UTF-8
        raise ValueError(f"{where}: not valid JSON ({type(err).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{where}: not a {FORMAT} manifest")
    k, parts = meta.get("k"), meta.get("parts")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{where}: k must be a positive integer, got {k!r}")
    if not isinstance(parts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("n_points"), int) for p in parts
    ):
        raise ValueError(f"{where}: parts must be a list of {{file, n_points}} entries")
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

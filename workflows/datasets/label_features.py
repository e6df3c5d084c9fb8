"""``dslide datasets label-rows``: the label rows of a set that ships its labels' features.

The XC Repository's label-feature sets (LF-AmazonTitles-131K and the like) give each
label's title as a row of the input's features, in a file of its own (``Yf.txt``, which
DECAF and SiameseXML call ``lbl_X_Xf.txt``): pyxclib's sparse layout, a header
``N_labels N_features`` and then a line a label of ``feature:value`` pairs. Written as
XC text, each row labelled with its own label, they are what ``dslide datasets debian
--label-rows`` writes for our own sets (:func:`~dslide_workflows.datasets.xc_build.
label_rows`): trained on beside the points through a glob, ``--train 'DIR/train*.txt'``.
"""

from __future__ import annotations

import fsspec
import numpy as np

from dslide_dask.data.csr import CSR, MAX_COLS
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.xc_text import UNKNOWN_SIZE, parse_header, write_xc
from dslide_dask.errors import DataError, XCFormatError
from dslide_dask.kernels.neighbours import normalised
from dslide_workflows.datasets.xc_build import own_rows

#: The most of a header line read (a training file's, to check its shape: never read whole).
HEADER_BYTES = 1 << 12


def read_sparse(url: str, storage_options: dict | None = None) -> CSR:
    """The matrix of a pyxclib sparse file: ``N_rows N_columns``, then a line a row of
    ``column:value`` pairs. A bad line raises :class:`XCFormatError` naming it; nothing
    is sized by the header's numbers before the lines are there."""
    so = storage_options or {}
    opened = fsspec.open(url, "rt", compression="infer", encoding="utf-8", errors="replace", **so)
    with opened as f:
        n_rows, n_cols = _header(url, f.readline(HEADER_BYTES))
        indptr, ids, values = [0], [], []
        for line_no, line in enumerate(f, start=2):
            if len(indptr) > n_rows:
                if line.strip():
                    raise XCFormatError(url, line_no, f"more rows than the header's {n_rows}")
                continue
            cols, vals = _row(url, line_no, line, n_cols)
            ids.append(cols)
            values.append(vals)
            indptr.append(indptr[-1] + len(cols))
    if len(indptr) <= n_rows:
        raise XCFormatError(
            url, None, f"the file ends after {len(indptr) - 1} row(s) but its header says {n_rows}"
        )
    flat_ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    flat_values = np.concatenate(values) if values else np.zeros(0, np.float32)
    return CSR(np.asarray(indptr, np.int64), flat_ids, flat_values, n_cols)


def _header(url: str, line: str) -> tuple[int, int]:
    parts = line.split()
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        shown = repr(line.strip()[:40])
        raise XCFormatError(url, 1, f"header must be 2 integers 'N_rows N_columns', got {shown}")
    n_rows, n_cols = int(parts[0]), int(parts[1])
    if n_cols > MAX_COLS:
        raise XCFormatError(url, 1, f"header N_columns {parts[1][:24]} exceeds {MAX_COLS:,}")
    return n_rows, n_cols


def _row(url: str, line_no: int, line: str, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A line's columns (ascending) and values, or the error naming its first bad pair."""
    tokens = line.split()
    try:
        flat = np.array(line.replace(":", " ").split(), dtype=np.float64)
    except ValueError:
        flat = np.zeros(0)
    if line.count(":") == len(tokens) and flat.size == 2 * len(tokens):
        cols, vals = flat[0::2], flat[1::2]
        good = (cols == np.floor(cols)) & (cols >= 0) & (cols < n_cols) & np.isfinite(vals)
        if good.all():
            order = np.argsort(cols, kind="stable")
            cols = cols[order].astype(np.int32)
            if cols.size > 1 and (np.diff(cols) == 0).any():
                twice = int(cols[1:][np.diff(cols) == 0][0])
                raise XCFormatError(url, line_no, f"column {twice} given twice")
            return cols, vals[order].astype(np.float32)
    bad = next((t for t in tokens if not _good_pair(t, n_cols)), line.strip())
    raise XCFormatError(
        url, line_no, f"expected 'column:value' with a column in [0, {n_cols}), got {bad[:40]!r}"
    )


def _good_pair(token: str, n_cols: int) -> bool:
    col, sep, value = token.partition(":")
    if not (sep and col.isascii() and col.isdigit() and int(col) < n_cols):
        return False
    try:
        return bool(np.isfinite(float(value)))
    except ValueError:
        return False


def label_rows(features: CSR) -> XCDataset:
    """Each label's features as a unit row labelled with it (labels without: none)."""
    values = normalised(features.indptr, features.values())
    return own_rows(CSR(features.indptr, features.indices, values, features.n_cols))


def write_label_rows(
    features_url: str, out: str, train_url: str, storage_options: dict | None = None
) -> XCDataset:
    """Write the label rows of ``features_url`` to ``out``, after checking that its
    labels and features are ``train_url``'s (a mismatch would train on wrong ids)."""
    so = storage_options or {}
    with fsspec.open(train_url, "rb", compression="infer", **so) as f:
        head = f.read(HEADER_BYTES)
    _, n_features, n_labels, _ = parse_header(head, train_url, UNKNOWN_SIZE)
    features = read_sparse(features_url, so)
    if (features.n_rows, features.n_cols) != (n_labels, n_features):
        raise DataError(
            f"{features_url}: {features.n_rows} labels x {features.n_cols} features, but "
            f"{train_url} has {n_labels} labels and {n_features} features"
        )
    rows = label_rows(features)
    write_xc(out, rows, so)
    return rows

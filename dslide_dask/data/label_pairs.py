"""Pairs of a test row and a label to leave out of its answers: the XC Repository's
``filter_labels_test.txt``.

The label-feature sets (LF-AmazonTitles-131K, LF-WikiSeeAlso-320K and the like) link
items to items, and a test item is often a label too: its own label, or one it links to
both ways, is dropped from its predictions before P@k is taken (as pyxclib-based
evaluations do), so published figures are filtered ones. The file holds one pair a line,
``row label``, both 0-based, no header. Read here as a pattern matrix of the test set's
rows, for :func:`~dslide_dask.metrics.drop_pairs`, or as :class:`LabelPairs` where the
rows are counted later (``dslide predict --filter-labels``).
"""

from __future__ import annotations

from dataclasses import dataclass

import fsspec
import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.errors import XCFormatError
from dslide_dask.masking import masked_errors
from dslide_dask.metrics import widest_count


@dataclass(frozen=True)
class LabelPairs:
    """The distinct pairs of a file, sorted by row then label, read before the rows they
    name are counted (``dslide predict`` counts its input as the workers read it): each
    pair's first ``line`` is kept to name it. Sorted, a partition's pairs are one slice
    (:meth:`rows_between`), wherever the partition starts."""

    url: str
    rows: np.ndarray
    labels: np.ndarray
    lines: np.ndarray
    n_labels: int

    def widest(self) -> int:
        """The most labels a row leaves out; past :data:`~dslide_dask.metrics.MAX_EXCLUDED`,
        :class:`XCFormatError` naming the row."""
        rows, counts = np.unique(self.rows, return_counts=True)
        try:
            return widest_count(counts, rows)
        except ValueError as e:
            raise XCFormatError(self.url, None, str(e)) from None

    def check_rows(self, n_rows: int, rows_of: str = "the test set's") -> None:
        """:class:`XCFormatError` naming the first line whose row is past ``n_rows``."""
        past = np.flatnonzero(self.rows >= n_rows)
        if len(past):
            first = past[np.argmin(self.lines[past])]
            raise XCFormatError(
                self.url,
                int(self.lines[first]),
                f"row {self.rows[first]} is past {rows_of} {n_rows:,} rows",
            )

    def matrix(self, n_rows: int, rows_of: str = "the test set's") -> CSR:
        """The pairs as a ``(n_rows, n_labels)`` pattern matrix; a row past ``n_rows``
        raises :class:`XCFormatError` naming its line."""
        self.check_rows(n_rows, rows_of)
        return self.rows_between(0, n_rows)

    def rows_between(self, start: int, stop: int) -> CSR:
        """The pairs of rows ``start`` to ``stop - 1`` as a pattern matrix of those rows
        (row ``start`` is its row 0)."""
        lo, hi = np.searchsorted(self.rows, (start, stop))
        counts = np.bincount(self.rows[lo:hi] - start, minlength=stop - start)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return CSR(indptr, self.labels[lo:hi], None, self.n_labels)


@masked_errors()  # a storage error names the URL: no credentials
def read_label_pairs(
    url: str, n_rows: int, n_labels: int, storage_options: dict | None = None
) -> CSR:
    """The pairs of ``url`` as a ``(n_rows, n_labels)`` pattern matrix.

    A line that is not two whole numbers, or names a row or label past the test set's,
    raises :class:`XCFormatError` naming the file and line, and so does a row that leaves
    out more than :data:`~dslide_dask.metrics.MAX_EXCLUDED` labels. Blank lines are
    skipped and a pair given twice counts once. Memory grows with the pairs read, never
    with a number the file declares."""
    pairs = read_pairs(url, n_labels, storage_options, n_rows)
    pairs.widest()
    return pairs.matrix(n_rows)


@masked_errors()
def read_pairs(
    url: str, n_labels: int, storage_options: dict | None = None, n_rows: int | None = None
) -> LabelPairs:
    """The pairs of ``url``, each checked as :func:`read_label_pairs` checks it; their
    rows against ``n_rows`` as they are read, if it is known, else against the most that
    a row id and a label id make a key of (``row * n_labels + label`` in int64)."""
    most = n_rows if n_rows is not None else np.iinfo(np.int64).max // max(n_labels, 1)
    past = "the test set's" if n_rows is not None else "the most ids of any input,"
    rows, labels, lines = [], [], []
    opened = fsspec.open(
        url,
        "rt",
        compression="infer",
        encoding="utf-8",
        errors="replace",
        **(storage_options or {}),
    )
    with opened as f:
        for line_no, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
                raise XCFormatError(
                    url,
                    line_no,
                    f"expected two whole numbers 'row label', got {line.strip()[:40]!r}",
                )
            row, label = int(parts[0]), int(parts[1])
            if row >= most:
                raise XCFormatError(
                    url, line_no, f"row {parts[0][:24]} is past {past} {most:,} rows"
                )
            if label >= n_labels:
                raise XCFormatError(
                    url, line_no, f"label {parts[1][:24]} is past the model's {n_labels:,} labels"
                )
            rows.append(row)
            labels.append(label)
            lines.append(line_no)
    width = np.int64(max(n_labels, 1))
    keys = np.asarray(rows, np.int64) * width + np.asarray(labels, np.int64)
    keys, first = np.unique(keys, return_index=True)  # sorted by row, then label
    return LabelPairs(
        url, keys // width, keys % width, np.asarray(lines, np.int64)[first], n_labels
    )


def pairs_matrix(rows: np.ndarray, labels: np.ndarray, n_rows: int, n_labels: int) -> CSR:
    """``(row, label)`` pairs (in range) as a pattern matrix, each row's labels sorted
    and given once."""
    keys = np.unique(rows * np.int64(n_labels) + labels)
    counts = np.bincount(keys // n_labels, minlength=n_rows)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return CSR(indptr, keys % n_labels, None, n_labels)

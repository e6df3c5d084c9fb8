"""Row blocks of a data set, made where their rows are and stacked where they are used.

Plain numpy and scipy (no Dask): the functions that Dask tasks run on each chunk or
partition of a user's collection, and the stacking of their results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dslide_dask.data.csr import CSR, as_csr
from dslide_dask.data.dataset import XCDataset


def block_csr(block, n_cols: int, pattern: bool = False, name: str = "X") -> CSR:
    """A chunk (scipy, pydata/sparse or numpy) as CSR; runs where the chunk is."""
    return as_csr(_to_scipy(block), n_cols, pattern=pattern, name=name)


def array_block(xb, yb, n_labels: int) -> XCDataset:
    X = block_csr(xb, xb.shape[1])
    Y = block_csr(yb, n_labels, pattern=True, name="Y")
    return XCDataset(X, Y)


def _to_scipy(block):
    import scipy.sparse

    if scipy.sparse.issparse(block):
        return block.tocsr()
    if hasattr(block, "to_scipy_sparse"):  # pydata/sparse
        return block.to_scipy_sparse().tocsr()
    return scipy.sparse.csr_matrix(np.asarray(block))


def bag_block(part) -> XCDataset:
    xs, ys = [], []
    for row in part:
        try:
            x, y = row
        except (TypeError, ValueError):
            raise ValueError(
                "a dask bag for fit must hold (x, labels) pairs: x a {feature id: value} "
                f"dict or a 1-row sparse matrix, labels a list of label ids; got {row!r:.80}"
            ) from None
        xs.append(x)
        ys.append(np.asarray(y, np.int64).ravel())
    return XCDataset(_rows_csr(xs), _labels_csr(ys))


def frame_block(part, x_col, y_col) -> XCDataset:
    ys = [np.asarray(y, np.int64).ravel() for y in part[y_col]]
    return XCDataset(_rows_csr(list(part[x_col])), _labels_csr(ys))


def _rows_csr(rows: list) -> CSR:
    """Feature rows (``{id: value}`` dicts or 1-row sparse matrices), as wide as the
    widest id among them (:func:`stack` widens blocks to a common width)."""
    ids, values, lengths, n_features = [], [], [], 1
    for row in rows:
        if isinstance(row, dict):
            i = np.fromiter(row.keys(), np.int64, len(row))
            v = np.fromiter(row.values(), np.float64, len(row))
        else:
            one = as_csr(row, name="X row")
            if one.n_rows != 1:
                raise ValueError(f"an X row must be one row, got {one.n_rows}")
            i, v = one.indices.astype(np.int64), one.values()
            n_features = max(n_features, one.n_cols)
        order = np.argsort(i, kind="stable")
        ids.append(i[order])
        values.append(v[order])
        lengths.append(len(i))
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if len(flat):
        n_features = max(n_features, int(flat.max()) + 1)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    out = CSR(indptr, flat, np.concatenate(values) if values else np.zeros(0), n_features)
    return as_csr(out, name="X")


def _labels_csr(rows: list) -> CSR:
    return CSR.from_lists(rows, 1 + max((int(r.max()) for r in rows if len(r)), default=0))


def stack(parts: Sequence[CSR], n_cols: int | None = None) -> CSR:
    """Rows of ``parts`` one after another, ``n_cols`` wide (default: the widest part)."""
    n_cols = max((p.n_cols for p in parts), default=1) if n_cols is None else n_cols
    counts = [p.indptr[-1] for p in parts]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    tails = [p.indptr[1:] + o for p, o in zip(parts, offsets, strict=False)]
    indptr = np.concatenate([[0], *tails])
    indices = np.concatenate([p.indices for p in parts]) if parts else np.zeros(0, np.int32)
    data = None
    if parts and parts[0].data is not None:
        data = np.concatenate([p.data for p in parts])
    return CSR(indptr, indices, data, n_cols)


def stack_datasets(
    parts: Sequence[XCDataset], n_features: int | None = None, n_labels: int | None = None
) -> XCDataset:
    """Blocks of a data set as one (bags' blocks may each be only as wide as their ids)."""
    return XCDataset(stack([p.X for p in parts], n_features), stack([p.Y for p in parts], n_labels))

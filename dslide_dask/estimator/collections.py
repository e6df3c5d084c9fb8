"""Dask collections as training and inference input.

A dask array (chunks of scipy, pydata/sparse or numpy matrices) is read block row by
block row into one :class:`~dslide_dask.data.csr.CSR`: sparse chunks stay sparse, and a
block is computed where its chunks already are (the current client's workers, or the
local scheduler) before only its non-zeros come to this process (on a cluster the model
then gets them from here, as any in-memory data). A dask bag of ``(x, labels)`` rows,
and a dask dataframe with one column of feature rows and one of label lists (not yet
covered by the tests: their environment has no pandas), are read the same way, one
partition at a time.
"""

from __future__ import annotations

import sys

import numpy as np

from dslide_dask.data.csr import CSR, as_csr


def is_dask_collection(obj) -> bool:
    """Whether ``obj`` is a Dask collection, without importing dask for other inputs."""
    if "dask" not in sys.modules:
        return False
    from dask import is_dask_collection as check

    return check(obj)


def _compute(*collections):
    import dask

    return dask.compute(*collections)


def _stack(parts: list[CSR], n_cols: int) -> CSR:
    """Rows of ``parts`` one after another (all of ``n_cols`` columns)."""
    counts = [p.indptr[-1] for p in parts]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    tails = [p.indptr[1:] + o for p, o in zip(parts, offsets, strict=False)]
    indptr = np.concatenate([[0], *tails])
    indices = np.concatenate([p.indices for p in parts]) if parts else np.zeros(0, np.int32)
    data = None
    if parts and parts[0].data is not None:
        data = np.concatenate([p.data for p in parts])
    return CSR(indptr, indices, data, n_cols)


def csr_of_array(X, name: str, pattern: bool = False, n_cols: int | None = None) -> CSR:
    """A 2-D dask array as CSR, block row by block row (never densified here: a dense
    numpy chunk is made sparse on the worker before it is sent)."""
    if getattr(X, "ndim", None) != 2:
        raise ValueError(f"{name}: expected a 2-D dask array, got {getattr(X, 'ndim', '?')}-D")
    if any(np.isnan(c) for c in X.shape):
        raise ValueError(
            f"{name}: a dask array of unknown chunk sizes (from a dataframe or a filter); "
            "call .compute_chunk_sizes() first"
        )
    width = int(X.shape[1])
    rows = X.rechunk({1: -1}) if X.numblocks[1] > 1 else X
    blocks = [rows.blocks[i, 0] for i in range(rows.numblocks[0])]
    parts = _compute(*[b.map_blocks(_to_scipy, dtype=X.dtype) for b in blocks])
    csrs = [as_csr(p, n_cols or width, pattern=pattern, name=name) for p in parts]
    return _stack(csrs, n_cols or width)


def _to_scipy(block):
    """A chunk as a scipy CSR matrix (runs where the chunk is)."""
    import scipy.sparse

    if scipy.sparse.issparse(block):
        return block.tocsr()
    if hasattr(block, "to_scipy_sparse"):  # pydata/sparse
        return block.to_scipy_sparse().tocsr()
    return scipy.sparse.csr_matrix(np.asarray(block))


def rows_of_bag(bag, n_features: int | None, n_labels: int | None) -> tuple[CSR, CSR]:
    """A dask bag of ``(x, labels)``: ``x`` a ``{feature id: value}`` dict or a 1-row
    sparse matrix, ``labels`` a list of label ids."""
    parts = _compute(*bag.to_delayed())
    xs, ys = [], []
    for part in parts:
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
    return _rows_csr(xs, n_features), _labels_csr(ys, n_labels)


def rows_of_frame(df, n_features: int | None, n_labels: int | None) -> tuple[CSR, CSR]:
    """A dask dataframe of two columns: feature rows (``{id: value}`` dicts) and label
    lists (in this order, or named ``X``/``features`` and ``Y``/``labels``)."""
    cols = list(df.columns)
    x_col = next((c for c in ("X", "features") if c in cols), cols[0])
    y_col = next((c for c in ("Y", "labels") if c in cols), cols[-1])
    if x_col == y_col:
        raise ValueError("a dask dataframe for fit needs a column of features and one of labels")
    parts = _compute(*df.to_delayed())
    xs, ys = [], []
    for part in parts:
        xs.extend(part[x_col])
        ys.extend(np.asarray(y, np.int64).ravel() for y in part[y_col])
    return _rows_csr(xs, n_features), _labels_csr(ys, n_labels)


def _rows_csr(rows: list, n_features: int | None) -> CSR:
    ids, values, lengths = [], [], []
    for row in rows:
        if isinstance(row, dict):
            i = np.fromiter(row.keys(), np.int64, len(row))
            v = np.fromiter(row.values(), np.float64, len(row))
        else:
            one = as_csr(row, name="X row")
            if one.n_rows != 1:
                raise ValueError(f"an X row must be one row, got {one.n_rows}")
            i, v = one.indices.astype(np.int64), one.values()
            n_features = n_features or one.n_cols
        order = np.argsort(i, kind="stable")
        ids.append(i[order])
        values.append(v[order])
        lengths.append(len(i))
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if n_features is None:
        n_features = int(flat.max()) + 1 if len(flat) else 1
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    out = CSR(indptr, flat, np.concatenate(values) if values else np.zeros(0), n_features)
    return as_csr(out, name="X")


def _labels_csr(rows: list, n_labels: int | None) -> CSR:
    if n_labels is None:
        n_labels = 1 + max((int(r.max()) for r in rows if len(r)), default=0)
    return CSR.from_lists(rows, n_labels)

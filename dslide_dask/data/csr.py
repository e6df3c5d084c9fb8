"""Compressed sparse rows as plain numpy arrays: the currency between data and kernels.

Kernels take the raw ``indptr``/``indices``/``data`` arrays; ``sparse.GCXS`` (and scipy
matrices, and lists of label arrays) are accepted and produced only at the public API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INDEX_DTYPE = np.int32
INDPTR_DTYPE = np.int64
VALUE_DTYPE = np.float32


@dataclass(frozen=True, eq=False)
class CSR:
    """Rows of a sparse matrix: ``indices[indptr[i]:indptr[i+1]]`` are row i's columns.

    ``data`` is None for a pattern-only matrix (label sets: every stored value is 1).
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray | None
    n_cols: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "indptr", np.ascontiguousarray(self.indptr, INDPTR_DTYPE))
        object.__setattr__(self, "indices", np.ascontiguousarray(self.indices, INDEX_DTYPE))
        if self.data is not None:
            object.__setattr__(self, "data", np.ascontiguousarray(self.data, VALUE_DTYPE))
            if len(self.data) != len(self.indices):
                raise ValueError("CSR data and indices differ in length")
        if self.indptr.ndim != 1 or len(self.indptr) == 0 or self.indptr[0] != 0:
            raise ValueError("CSR indptr must be 1-D and start at 0")
        if self.indptr[-1] != len(self.indices):
            raise ValueError("CSR indptr[-1] must equal the number of stored entries")

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    @property
    def nnz(self) -> int:
        return len(self.indices)

    def __len__(self) -> int:
        return self.n_rows

    def values(self) -> np.ndarray:
        """Stored values; ones for a pattern-only matrix."""
        return self.data if self.data is not None else np.ones(self.nnz, VALUE_DTYPE)

    def row(self, i: int) -> np.ndarray:
        return self.indices[self.indptr[i] : self.indptr[i + 1]]

    def slice_rows(self, start: int, stop: int) -> CSR:
        """Rows ``start:stop`` (views where possible)."""
        start, stop = max(0, start), min(self.n_rows, stop)
        lo, hi = self.indptr[start], self.indptr[stop]
        return CSR(
            self.indptr[start : stop + 1] - lo,
            self.indices[lo:hi],
            None if self.data is None else self.data[lo:hi],
            self.n_cols,
        )

    def take_rows(self, rows: np.ndarray) -> CSR:
        """Rows in the given order (a copy)."""
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.indptr[rows + 1] - self.indptr[rows]
        indptr = np.zeros(len(rows) + 1, INDPTR_DTYPE)
        np.cumsum(lengths, out=indptr[1:])
        gather = np.repeat(self.indptr[rows] - indptr[:-1], lengths) + np.arange(indptr[-1])
        data = None if self.data is None else self.data[gather]
        return CSR(indptr, self.indices[gather], data, self.n_cols)

    def to_gcxs(self):
        """This matrix as a ``sparse.GCXS`` (row-compressed)."""
        import sparse

        return sparse.GCXS(
            (self.values(), self.indices, self.indptr),
            shape=self.shape,
            compressed_axes=(0,),
        )

    def to_lists(self) -> list[np.ndarray]:
        """Row i's column ids as a list of arrays (label sets)."""
        return np.split(self.indices, self.indptr[1:-1])

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], n_cols: int) -> CSR:
        """A pattern-only matrix from a list of id arrays (e.g. label sets)."""
        lengths = np.fromiter((len(r) for r in rows), dtype=INDPTR_DTYPE, count=len(rows))
        indptr = np.zeros(len(rows) + 1, INDPTR_DTYPE)
        np.cumsum(lengths, out=indptr[1:])
        flat = [np.asarray(r, dtype=np.int64).ravel() for r in rows]
        indices = np.concatenate(flat) if flat else np.zeros(0, np.int64)
        check_ids(indices, n_cols, "label")
        return cls(indptr, indices, None, n_cols)


def check_ids(ids: np.ndarray, n_cols: int, what: str) -> None:
    """Raise a clear ValueError if any id is outside ``[0, n_cols)``."""
    if len(ids) and (ids.min() < 0 or ids.max() >= n_cols):
        bad = ids[(ids < 0) | (ids >= n_cols)][0]
        raise ValueError(f"{what} id {int(bad)} out of range [0, {n_cols})")


def as_csr(
    matrix, n_cols: int | None = None, *, pattern: bool = False, name: str = "matrix"
) -> CSR:
    """Convert what users pass (CSR, ``sparse`` arrays, scipy matrices, numpy arrays, lists
    of id arrays) to :class:`CSR`. ``pattern=True`` drops values (label indicator matrices).

    Careless input is refused or read as meant, with ``name`` in the message: a list of
    rows is a dense matrix of values for features (``pattern=False``) and a list of
    label-id arrays for labels, unless its rows are equal-length 0/1 indicators that
    repeat an id (then an indicator matrix); object arrays are converted to numbers or
    refused; NaN or infinite values and ids out of range are named with their row.
    """
    if isinstance(matrix, CSR):
        out = matrix
        check_ids(out.indices, out.n_cols, f"{name} column")
    elif isinstance(matrix, list | tuple):
        if not pattern or _indicator_rows(matrix):
            out = _csr_from_array_like(_numeric(matrix, name))
        else:
            rows = _label_rows(matrix, name)
            if n_cols is None:
                n_cols = 1 + max((int(r.max()) for r in rows if len(r)), default=-1)
            return CSR.from_lists(rows, n_cols)
    else:
        if isinstance(matrix, np.ndarray) and matrix.dtype.hasobject:
            matrix = _numeric(matrix, name)
        out = _csr_from_array_like(matrix)
    if pattern and out.data is not None:
        out = CSR(out.indptr, out.indices, None, out.n_cols)
    if out.data is not None and not np.isfinite(out.data).all():
        at = int(np.flatnonzero(~np.isfinite(out.data))[0])
        row = int(np.searchsorted(out.indptr, at, side="right")) - 1
        raise ValueError(
            f"{name} holds {out.data[at]} at row {row}, column {int(out.indices[at])}: "
            "values must be finite numbers"
        )
    if n_cols is not None and out.n_cols != n_cols:
        raise ValueError(f"{name} has {out.n_cols} columns, expected {n_cols}")
    return out


def _numeric(rows, name: str) -> np.ndarray:
    """A list of rows (or an object array) as a 2-D float matrix, or a ValueError."""
    try:
        dense = np.asarray(rows, dtype=np.float64)
    except (ValueError, TypeError):
        raise ValueError(
            f"{name} is not a numeric matrix (rows of different lengths or non-numbers): "
            "pass a 2-D numeric array or a sparse matrix"
        ) from None
    if dense.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got shape {dense.shape}")
    return dense


def _indicator_rows(rows) -> bool:
    """Whether label rows are a 0/1 indicator matrix rather than label-id lists: equal
    lengths, only 0 and 1, and some row repeating an id (no id list can)."""
    try:
        arr = np.asarray(rows)
    except ValueError:
        return False
    if arr.ndim != 2 or arr.shape[1] < 2 or arr.dtype.kind not in "biuf":
        return False
    if arr.dtype.kind == "b":
        return True
    zero_one = ((arr == 0) | (arr == 1)).all()
    return bool(zero_one and ((arr == 0).sum(1) > 1).any() | ((arr == 1).sum(1) > 1).any())


def _label_rows(rows, name: str) -> list[np.ndarray]:
    """Label-id rows as int64 arrays; non-integers and repeated ids refused."""
    out = []
    for i, r in enumerate(rows):
        a = np.asarray(r).ravel()
        whole = a.dtype.kind in "iu" or (a.dtype.kind == "f" and np.array_equal(a, np.round(a)))
        if a.size and not whole:
            raise ValueError(f"{name} row {i}: label ids must be integers, got {a[:5]}")
        a = a.astype(np.int64)
        if len(np.unique(a)) != len(a):
            raise ValueError(f"{name} row {i} repeats a label id: {a[:10].tolist()}")
        out.append(a)
    return out


def _csr_from_array_like(matrix) -> CSR:
    import sparse

    if isinstance(matrix, np.ndarray):
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        matrix = sparse.GCXS.from_numpy(matrix, compressed_axes=(0,))
    if isinstance(matrix, sparse.SparseArray):
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        if not (isinstance(matrix, sparse.GCXS) and matrix.compressed_axes == (0,)):
            matrix = sparse.GCXS(matrix, compressed_axes=(0,))
        return CSR(matrix.indptr, matrix.indices, matrix.data, matrix.shape[1])
    if hasattr(matrix, "tocsr"):  # scipy.sparse, without importing scipy
        m = matrix.tocsr()
        m.sort_indices()
        return CSR(m.indptr, m.indices, m.data, m.shape[1])
    raise TypeError(f"cannot use {type(matrix).__name__} as a sparse matrix")

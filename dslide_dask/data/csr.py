"""Compressed sparse rows as plain numpy arrays: the currency between data and kernels.

Kernels take the raw ``indptr``/``indices``/``data`` arrays; ``sparse.GCXS`` (and scipy
matrices, and lists of label arrays) are accepted and produced only at the public API.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dslide_dask.kernels.csr_checks import well_formed

INDEX_DTYPE = np.int32
INDPTR_DTYPE = np.int64
VALUE_DTYPE = np.float32
#: Column ids (features, labels) are 32-bit in every kernel and file format: the widest
#: matrix there can be, as the text reader's header limit.
MAX_COLS = int(np.iinfo(INDEX_DTYPE).max)
#: Rows embedded or scored at a time by default (top-k, the hidden layers' output): the
#: exact top-k's score block is rows x 16K floats.
SCORE_ROWS = 4096


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
        if not 0 <= self.n_cols <= MAX_COLS:
            raise ValueError(
                f"CSR n_cols must be in [0, {MAX_COLS}] (32-bit ids), got {self.n_cols}"
            )
        _refuse_wrapping(self.indices)
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

    def __getitem__(self, key) -> CSR:
        """Rows as scipy's ``csr_matrix`` gives them: ``X[3]`` (one row, kept 2-D),
        ``X[:3]``, ``X[::2]``, ``X[[0, 5]]``, ``X[mask]``, ``X[rows, :]``; always a
        :class:`CSR`. Columns are not selectable (a model's input is every feature)."""
        if isinstance(key, tuple):
            if len(key) == 2 and isinstance(key[1], slice) and key[1] == slice(None):
                key = key[0]
            else:
                raise IndexError("a CSR selects rows only (X[rows] or X[rows, :]), not columns")
        if isinstance(key, slice):
            start, stop, step = key.indices(self.n_rows)
            if step == 1:
                return self.slice_rows(start, max(start, stop))
            return self.take_rows(np.arange(start, stop, step))
        if isinstance(key, numbers.Integral) and not isinstance(key, bool):
            return self.take_rows(self._row_ids(np.asarray([int(key)])))
        rows = np.asarray(key)
        if rows.dtype == bool:
            if rows.shape != (self.n_rows,):
                raise IndexError(
                    f"a boolean row mask must have {self.n_rows} values, got shape {rows.shape}"
                )
            return self.take_rows(np.flatnonzero(rows))
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise IndexError(
                "rows must be an int, a slice, a 1-D array of ints or a boolean mask, "
                f"got {key!r:.80}"
            )
        return self.take_rows(self._row_ids(rows.astype(np.int64)))

    def _row_ids(self, rows: np.ndarray) -> np.ndarray:
        """Row ids with negatives counted from the end, each in range (IndexError)."""
        out = np.where(rows < 0, rows + self.n_rows, rows)
        if out.size and (out.min() < 0 or out.max() >= self.n_rows):
            bad = rows[(out < 0) | (out >= self.n_rows)][0]
            raise IndexError(f"row {int(bad)} is out of range for {self.n_rows} rows")
        return out

    def __array__(self, dtype=None, copy=None):
        """Refused: a CSR of 100K+ columns is not made dense behind a caller's back (and
        numpy would otherwise read it as a nested sequence of rows)."""
        raise TypeError(
            "a CSR is sparse and is not converted to a dense array implicitly: use "
            ".to_gcxs().todense() (or scipy.sparse.csr_matrix) for small matrices"
        )

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
    def from_lists(cls, rows: Sequence[Sequence[int] | np.ndarray], n_cols: int) -> CSR:
        """A pattern-only matrix from a list of id arrays (e.g. label sets)."""
        lengths = np.fromiter((len(r) for r in rows), dtype=INDPTR_DTYPE, count=len(rows))
        indptr = np.zeros(len(rows) + 1, INDPTR_DTYPE)
        np.cumsum(lengths, out=indptr[1:])
        flat = [np.asarray(r, dtype=np.int64).ravel() for r in rows]
        indices = np.concatenate(flat) if flat else np.zeros(0, np.int64)
        check_ids(indices, n_cols, "label")
        return cls(indptr, indices, None, n_cols)


def row_ranges(
    n_rows: int, size: int = SCORE_ROWS, *, at_least_one: bool = False
) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of at most ``size`` of ``n_rows`` rows, in
    order. None for no rows, unless ``at_least_one``: then one empty block ``(0, 0)``, for
    a caller that concatenates the blocks' outputs (an empty block's has the right width).
    """
    for start in range(0, max(n_rows, int(at_least_one)), size):
        yield start, min(start + size, n_rows)


def _refuse_wrapping(indices) -> None:
    """Ids wider than 32 bits would wrap when cast (2**33 + 7 becoming 7): refused."""
    raw = np.asarray(indices)
    if raw.dtype != INDEX_DTYPE and raw.dtype.kind in "iu" and raw.size:
        low, high = int(raw.min()), int(raw.max())
        if low < np.iinfo(INDEX_DTYPE).min or high > MAX_COLS:
            bad = low if low < np.iinfo(INDEX_DTYPE).min else high
            raise ValueError(f"CSR index {bad} does not fit 32 bits (ids are in [0, {MAX_COLS}])")


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
    checked = False  # well formed: no check below can fail
    if isinstance(matrix, CSR):
        out = matrix
        checked = well_formed(out.indptr, out.indices, out.data, out.n_cols)
        if not checked:
            _check_row_ids(out.indptr, out.indices, out.n_cols, name)
    elif isinstance(matrix, list | tuple):
        if not pattern or _indicator_rows(matrix):
            out = _csr_from_array_like(_numeric(matrix, name), name)
        else:
            rows = _label_rows(matrix, name)
            if n_cols is None:
                n_cols = 1 + max((int(r.max()) for r in rows if len(r)), default=-1)
                _check_shape((len(rows), n_cols), name)
            return CSR.from_lists(rows, n_cols)
    else:
        if isinstance(matrix, np.ndarray) and matrix.dtype.hasobject:
            matrix = _numeric(matrix, name)
        out = _csr_from_array_like(matrix, name)
    if not checked:
        _refuse_repeats(out, name)
    if pattern and out.data is not None:
        out = CSR(out.indptr, out.indices, None, out.n_cols)
    if out.data is not None and not checked and not np.isfinite(out.data).all():
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


def _csr_from_array_like(matrix, name: str = "matrix") -> CSR:
    """Shapes and ids are checked on the arrays as given, before anything is sized by
    them or cast to 32 bits (a cast would wrap an id of 2**33 + 7 to 7)."""
    import sparse

    if isinstance(matrix, np.ndarray):
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        _check_shape(matrix.shape, name)
        matrix = sparse.GCXS.from_numpy(matrix, compressed_axes=(0,))
    if isinstance(matrix, sparse.SparseArray):
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        _check_shape(matrix.shape, name)
        if not (isinstance(matrix, sparse.GCXS) and matrix.compressed_axes == (0,)):
            _check_row_room(matrix.shape[0], name)
            matrix = sparse.GCXS(matrix, compressed_axes=(0,))
        _check_row_ids(matrix.indptr, matrix.indices, matrix.shape[1], name)
        return CSR(matrix.indptr, matrix.indices, matrix.data, matrix.shape[1])
    if hasattr(matrix, "tocsr"):  # scipy.sparse, without importing scipy
        _check_shape(matrix.shape, name)
        if getattr(matrix, "format", "csr") != "csr":
            _check_row_room(matrix.shape[0], name)
        m = matrix.tocsr()
        _check_row_ids(m.indptr, m.indices, m.shape[1], name)
        m.sort_indices()
        return CSR(m.indptr, m.indices, m.data, m.shape[1])
    raise TypeError(f"{name}: cannot use {type(matrix).__name__} as a sparse matrix")


def _check_shape(shape, name: str) -> None:
    """At most :data:`MAX_COLS` columns (ids are 32-bit)."""
    n_cols = int(shape[1])
    if n_cols > MAX_COLS:
        raise ValueError(
            f"{name} has {n_cols:,} columns, more than the {MAX_COLS:,} (2**31 - 1) "
            "supported: feature and label ids are 32-bit"
        )


def _check_row_room(n_rows: int, name: str) -> None:
    """Converting to rows allocates a row pointer a row: only if they fit in memory."""
    from dslide_dask.memory import check_memory

    check_memory(8 * (int(n_rows) + 1), f"{name} ({int(n_rows):,} rows)")


def _check_row_ids(indptr, indices, n_cols: int, name: str) -> None:
    """Every id in ``[0, n_cols)``, checked in its own dtype; the first bad one named
    with its row."""
    ids = np.asarray(indices)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"{name}: column ids must be integers, got {ids.dtype}")
    if not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < n_cols):
        return
    at = int(np.flatnonzero((ids < 0) | (ids >= n_cols))[0])
    row = int(np.searchsorted(np.asarray(indptr), at, side="right")) - 1
    raise ValueError(
        f"{name} row {row} has column id {int(ids[at])}, outside the matrix's {n_cols:,} columns"
    )


def _refuse_repeats(m: CSR, name: str) -> None:
    """A row holding a column twice (scipy keeps such duplicates, and sums them only
    when asked) is refused, as the text reader refuses a repeated id."""
    if m.nnz < 2:
        return
    rows = np.repeat(np.arange(m.n_rows, dtype=np.int64), np.diff(m.indptr))
    same_row = rows[1:] == rows[:-1]
    if ((np.diff(m.indices) > 0) | ~same_row).all():
        return  # strictly increasing within every row
    order = np.lexsort((m.indices, rows))
    ids, rows = m.indices[order], rows[order]
    repeat = (ids[1:] == ids[:-1]) & (rows[1:] == rows[:-1])
    if repeat.any():
        k = int(np.flatnonzero(repeat)[0])
        raise ValueError(
            f"{name} row {int(rows[k])} holds column {int(ids[k])} more than once: each "
            "row may hold a column once (scipy: call sum_duplicates() first)"
        )

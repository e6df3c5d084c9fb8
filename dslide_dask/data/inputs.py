"""Training and evaluation data as users hand it over, checked where it meets a model.

Two checks live here so that every entry point makes them the same way:
:func:`labelled_data` turns Python ``X``/``Y`` into a data set or a clear ValueError, and
:func:`check_fits` refuses data whose shape is not the model's (a feature id past the
model's input layer would make a kernel read past the weights).
"""

from __future__ import annotations

from dslide_dask.data.csr import as_csr, check_ids
from dslide_dask.data.dataset import XCDataset


def labelled_data(X, Y, n_labels: int | None = None) -> XCDataset:
    """``(X, Y)`` as a data set with at least one point (see :func:`as_csr`); label-id
    lists in ``Y`` span ``n_labels`` labels if given (a model's), else up to their
    largest id."""
    X = as_csr(X, name="X")
    Y = as_csr(Y, n_labels, pattern=True, name="Y")
    if X.n_rows != Y.n_rows:
        raise ValueError(f"X has {X.n_rows} rows but Y has {Y.n_rows}")
    if X.n_rows == 0:
        raise ValueError("X and Y have no rows: there is nothing to train on")
    return XCDataset(X, Y)


def check_fits(data, n_features: int, n_labels: int, what: str = "the data") -> None:
    """Raise ValueError unless ``data`` (a data set, or a planned source: anything with
    ``n_features``/``n_labels``) has the model's features and labels.

    Fewer is refused too: XC files of one data set share one header, so a test file
    declaring other sizes comes from other data, and its ids do not mean the model's.
    In-memory rows are also checked id by id (a CSR can be built by hand).
    """
    have = (int(data.n_features), int(data.n_labels))
    if have != (n_features, n_labels):
        raise ValueError(
            f"{what} has {have[0]} features and {have[1]} labels, the model "
            f"{n_features} and {n_labels}: not the data set the model was trained on"
        )
    if isinstance(data, XCDataset):
        check_ids(data.X.indices, n_features, f"{what}: feature")
        check_ids(data.Y.indices, n_labels, f"{what}: label")

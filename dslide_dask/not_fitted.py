"""scikit-learn's ``NotFittedError`` under :class:`~dslide_dask.errors.DslideError`, in a
module of its own: importing scikit-learn is left to what uses an estimator."""

from __future__ import annotations

from sklearn.exceptions import NotFittedError as _SklearnNotFitted

from dslide_dask.errors import DslideError


class NotFittedError(DslideError, _SklearnNotFitted):
    """An estimator used before ``fit`` (scikit-learn's ``NotFittedError`` as well)."""

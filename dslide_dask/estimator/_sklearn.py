"""What differs between the scikit-learn releases we support (1.5 to the newest).

One place for it, so the classifier reads as plain scikit-learn: 1.6 moved input
validation to the function :func:`sklearn.utils.validation.validate_data` and estimator
tags to ``__sklearn_tags__``; 1.5 has the method ``_validate_data`` and ``_more_tags``.
"""

from __future__ import annotations

from sklearn.utils.validation import check_is_fitted

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # scikit-learn 1.5
    _validate_data = None

HAS_TAG_OBJECTS = _validate_data is not None

__all__ = ["HAS_TAG_OBJECTS", "check_is_fitted", "validate_data"]


def validate_data(estimator, X, *, reset: bool):
    """``X`` (numpy, scipy, array-like) checked as scikit-learn checks it: 2-D, finite,
    numeric, sparse kept sparse (CSR); sets or checks ``n_features_in_``."""
    kwargs = dict(accept_sparse="csr", dtype=("float32", "float64"), reset=reset)
    if _validate_data is None:
        return estimator._validate_data(X, **kwargs)
    return _validate_data(estimator, X, **kwargs)

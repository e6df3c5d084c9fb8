"""The scikit-learn estimator: :class:`SlideClassifier`, and a P@k scorer for model
selection (``GridSearchCV(..., scoring=p_at_k_scorer(3))``)."""

from dslide_dask.estimator._training import StepCallback
from dslide_dask.estimator.classifier import (
    ENGINE_PARAMS,
    EXPECTED_FAILED_CHECKS,
    SlideClassifier,
    p_at_k_scorer,
)

__all__ = [
    "ENGINE_PARAMS",
    "EXPECTED_FAILED_CHECKS",
    "SlideClassifier",
    "StepCallback",
    "p_at_k_scorer",
]

"""dslide-dask: Distributed SLIDE on Dask.

LSH-sampled sparse training of very wide networks (extreme classification), in numba
kernels on one machine, and model-parallel across a Dask cluster.

Importing it sets no environment variable and imports no ``distributed`` (that comes
with the first model trained on a cluster: :mod:`dslide_dask.distributed`) and no
scikit-learn: the estimator is imported when first named, so the CLI and the Dask
workers it starts (which import its module again) skip 0.75 s of scikit-learn and SciPy.
"""

from typing import TYPE_CHECKING

from dslide_dask.data import CSR, XCDataset, as_csr
from dslide_dask.errors import DslideError
from dslide_dask.metrics import precision_at_k
from dslide_dask.model import SlideConfig, SlideNetwork

if TYPE_CHECKING:
    from dslide_dask.estimator import SlideClassifier
    from dslide_dask.not_fitted import NotFittedError

__version__ = "0.1.0"

__all__ = [
    "CSR",
    "DslideError",
    "NotFittedError",
    "SlideClassifier",
    "SlideConfig",
    "SlideNetwork",
    "XCDataset",
    "__version__",
    "as_csr",
    "precision_at_k",
]


def __getattr__(name: str):
    if name == "SlideClassifier":
        from dslide_dask.estimator import SlideClassifier

        return SlideClassifier
    if name == "NotFittedError":
        from dslide_dask.not_fitted import NotFittedError

        return NotFittedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""dslide-dask: Distributed SLIDE on Dask.

LSH-sampled sparse training of very wide networks (extreme classification), in numba
kernels on one machine, and model-parallel across a Dask cluster.

Importing it sets no environment variable and imports no ``distributed``: that comes
with the first model trained on a cluster (:mod:`dslide_dask.distributed`).
"""

from dslide_dask.data import CSR, XCDataset, as_csr
from dslide_dask.errors import DslideError, NotFittedError
from dslide_dask.estimator import SlideClassifier
from dslide_dask.metrics import precision_at_k
from dslide_dask.model import SlideConfig, SlideNetwork

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

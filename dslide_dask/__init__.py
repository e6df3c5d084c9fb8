"""dslide-dask: Distributed SLIDE on Dask.

LSH-sampled sparse training of very wide networks (extreme classification), in numba
kernels on one machine, and model-parallel across a Dask cluster.
"""

import os

# numba's OpenMP threading layer spins between parallel regions by default; on a busy
# machine (other processes, Dask workers side by side) each kernel launch then waits
# for a scheduler time slice (~8 ms measured on 2 cores against ~0.01 ms passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from dslide_dask.data import CSR, XCDataset, as_csr  # noqa: E402
from dslide_dask.estimator import SlideClassifier  # noqa: E402
from dslide_dask.metrics import precision_at_k  # noqa: E402
from dslide_dask.model import SlideConfig, SlideNetwork  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CSR",
    "SlideClassifier",
    "SlideConfig",
    "SlideNetwork",
    "XCDataset",
    "__version__",
    "as_csr",
    "precision_at_k",
]

"""Data: CSR containers, the Extreme Classification text format, synthetic data sets."""

from dslide_dask.data.csr import CSR, as_csr
from dslide_dask.data.dataset import XCDataset

__all__ = ["CSR", "XCDataset", "as_csr"]

"""Data: CSR containers, the Extreme Classification text format, synthetic data sets."""

from dslide_dask.data.csr import CSR, as_csr
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.synthetic import (
    PRESETS,
    SyntheticSpec,
    generate,
    make_synthetic,
    resolve_spec,
)
from dslide_dask.data.xc_text import XCFormatError, parse_xc, read_xc, write_xc

__all__ = [
    "CSR",
    "PRESETS",
    "SyntheticSpec",
    "XCDataset",
    "XCFormatError",
    "as_csr",
    "generate",
    "make_synthetic",
    "parse_xc",
    "read_xc",
    "resolve_spec",
    "write_xc",
]

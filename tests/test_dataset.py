"""XCDataset's row selection: an evaluation sample covers the whole file."""

import numpy as np

from dslide_dask.data.batches import load
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset


def sorted_set(n: int) -> XCDataset:
    """Row i has feature i and label i // 10: sorted by label, as XC files often are."""
    X = CSR(np.arange(n + 1), np.arange(n, dtype=np.int32), np.ones(n, np.float32), n)
    Y = CSR.from_lists([[i // 10] for i in range(n)], n // 10)
    return XCDataset(X, Y)


def test_a_sample_spreads_over_the_rows_in_order():
    data = sorted_set(100)
    rows = data.sample(5).X.indices.tolist()
    assert rows == [0, 25, 50, 74, 99]
    assert len(set(data.sample(5).Y.indices.tolist())) == 5  # 5 labels, not the first one
    assert data.sample(None) is data and data.sample(1000) is data


def test_evaluation_data_are_a_spread_sample_not_a_prefix():
    data = sorted_set(100)
    assert load(data, max_points=10).X.indices.tolist() == data.sample(10).X.indices.tolist()
    assert load(data).n_points == 100

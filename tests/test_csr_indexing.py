"""``CSR`` rows indexed as scipy's ``csr_matrix`` indexes them (``test.X[:3]``, issue 53)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

from dslide_dask.data import CSR


@pytest.fixture
def pair() -> tuple[CSR, scipy.sparse.csr_matrix]:
    rng = np.random.default_rng(0)
    dense = rng.random((9, 6)) * (rng.random((9, 6)) < 0.4)
    dense[4] = 0  # an empty row
    m = scipy.sparse.csr_matrix(dense.astype(np.float32))
    return CSR(m.indptr, m.indices, m.data, 6), m


@pytest.mark.parametrize(
    "key",
    [
        slice(None, 3),
        slice(2, 7),
        slice(None, None, 2),
        slice(None, None, -1),
        slice(-3, None),
        slice(5, 2),
        [0, 5],
        [8, 0, 0, -1],
        np.array([3, 4, 1]),
        3,
        -1,
        np.int64(2),
        np.arange(9) % 3 == 0,
        (slice(1, 4), slice(None)),
        [],
    ],
    ids=repr,
)
def test_rows_as_scipy_selects_them(pair, key) -> None:
    X, m = pair
    got = X[key]
    want = m[key]
    if want.ndim == 1:  # scipy's sparse arrays give 1-D for an int; csr_matrix keeps 2-D
        want = want.reshape(1, -1)
    assert isinstance(got, CSR)
    assert got.shape == want.shape
    back = scipy.sparse.csr_matrix((got.values(), got.indices, got.indptr), shape=got.shape)
    np.testing.assert_array_equal(back.toarray(), want.toarray())


def test_a_pattern_matrix_keeps_no_values(pair) -> None:
    X, _ = pair
    Y = CSR(X.indptr, X.indices, None, X.n_cols)
    assert Y[:2].data is None and Y[[1, 0]].data is None


@pytest.mark.parametrize(
    "key, words",
    [
        (9, "row 9 is out of range for 9 rows"),
        ([0, -10], "row -10 is out of range"),
        (np.ones(3, bool), "9 values"),
        ((0, 1), "rows only"),
        (1.5, "rows must be"),
        ([[0, 1]], "rows must be"),
    ],
    ids=repr,
)
def test_bad_row_keys_say_what_rows_may_be(pair, key, words) -> None:
    X, _ = pair
    with pytest.raises(IndexError, match=words):
        X[key]


def test_never_made_dense_behind_the_callers_back(pair) -> None:
    X, _ = pair
    with pytest.raises(TypeError, match="sparse"):
        np.asarray(X)


def test_the_readme_quickstart_slice() -> None:
    from dslide_dask import SlideClassifier
    from dslide_dask.data import make_synthetic

    train, test = make_synthetic("tiny", seed=0)
    clf = SlideClassifier(epochs=1, client=False, neighbours=0).fit(train.X[:300], train.Y[:300])
    assert clf.predict_topk(test.X[:3], k=5).shape == (3, 5)

"""Bad parameters are refused with a message naming the parameter and its range."""

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.data.csr import CSR


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"K": 0}, r"K must be an integer in \[1, 21\], got 0"),
        ({"K": 30}, r"K must be an integer in \[1, 21\]"),
        ({"hash_family": "simhash", "K": 65}, r"K must be an integer in \[1, 64\]"),
        ({"L": 0}, r"L must be an integer in \[1, 1024\], got 0"),
        ({"L": 2.5}, r"L must be an integer"),
        ({"range_pow": 31}, r"range_pow must be an integer in \[1, 30\]"),
        ({"bucket_capacity": 0}, r"bucket_capacity must be an integer in \[1, 65536\]"),
        ({"L": 1024, "range_pow": 20, "bucket_capacity": 64}, r"hash tables would take 256\.0 GiB"),
        ({"hidden": ()}, r"hidden must list at least one layer width"),
        ({"hidden": (0,)}, r"hidden must be an integer in \[1, 65536\], got 0"),
        ({"lr": 0.0}, r"lr must be a number in \(0\.0, 10\.0\], got 0\.0"),
        ({"lr": float("nan")}, r"lr must be a number"),
        ({"beta1": 1.0}, r"beta1 must be a number in \[0\.0, 1\.0\)"),
        ({"bin_size": 6}, r"bin_size must be a power of two, got 6"),
        ({"bin_size": 256}, r"bin_size must be an integer in \[2, 128\]"),
        ({"hash_family": "minhash"}, r"hash_family must be one of \['dwta', 'simhash'\]"),
        ({"bucket_policy": "lru"}, r"bucket_policy must be one of \['fifo', 'reservoir'\]"),
        ({"strategy": "all"}, r"strategy must be one of"),
        ({"optimizer": "sgd"}, r"optimizer must be one of \['adam', 'dense-adam'\]"),
        ({"min_active": 10, "max_active": 5}, r"min_active must be an integer in \[0, 5\]"),
        ({"threshold": 0}, r"threshold must be an integer in \[1, 50\]"),
        ({"rebuild_every": -1}, r"rebuild_every must be an integer in \[0, "),
        ({"rebuild_growth": -1.0}, r"rebuild_growth must be a number in \[0\.0, 1\.0\]"),
    ],
)
def test_bad_config_names_the_parameter(params, message):
    with pytest.raises(ValueError, match=message):
        SlideConfig(**params)


def test_unknown_parameter_is_named():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['Kk'\]"):
        SlideConfig.from_dict({"Kk": 3})


def small_xy(n=12, n_features=20, n_labels=10):
    rng = np.random.default_rng(0)
    X = CSR(np.arange(n + 1) * 2, rng.integers(0, n_features, 2 * n), np.ones(2 * n), n_features)
    return X, [[i % n_labels] for i in range(n)]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"batch_size": 0}, r"batch_size must be an integer in \[1, "),
        ({"epochs": 0}, r"epochs must be an integer in \[1, "),
        ({"K": -1}, r"K must be an integer"),
        ({"n_threads": 10_000}, r"n_threads must be an integer in \[1, "),
    ],
)
def test_classifier_refuses_bad_parameters_at_fit(params, message):
    X, Y = small_xy()
    with pytest.raises(ValueError, match=message):
        SlideClassifier(hidden=(8,), bin_size=4, **params).fit(X, Y)


def test_classifier_refuses_mismatched_inputs():
    X, Y = small_xy()
    with pytest.raises(ValueError, match="X has 12 rows but Y has 7"):
        SlideClassifier().fit(X, Y[:7])
    clf = SlideClassifier(hidden=(8,), bin_size=4, L=4, range_pow=4).fit(X, Y)
    X_wide = CSR(X.indptr, X.indices, X.data, 21)
    with pytest.raises(ValueError, match="X has 21 features, the model was fitted with 20"):
        clf.predict_topk(X_wide)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 10\], got 11"):
        clf.predict_topk(X, k=11)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        SlideClassifier().predict(X)
    with pytest.raises(ValueError, match=r"label id 10 out of range \[0, 10\)"):
        CSR.from_lists([[10]], 10)


@pytest.mark.parametrize("hidden", [[1.9], (64.0,), None, "abc", [True]])
def test_hidden_widths_are_integers_not_truncated(hidden):
    with pytest.raises(ValueError, match="hidden must"):
        SlideConfig(hidden=hidden)


def test_hidden_takes_numpy_integers():
    assert SlideConfig(hidden=np.array([32, 16])).hidden == (32, 16)

"""SlideClassifier: learning on synthetic data, and scikit-learn conventions."""

import warnings

import numpy as np
import pytest

from dslide_dask import SlideClassifier, precision_at_k
from dslide_dask.errors import NetworkAloneWarning

PARAMS = dict(hidden=(64,), K=3, L=20, range_pow=9, lr=1e-2, batch_size=128, seed=0)


@pytest.fixture(scope="module")
def fitted(tiny):
    train, _ = tiny
    return SlideClassifier(epochs=5, **PARAMS).fit(train.X, train.Y)


def test_learns_far_above_the_frequency_baseline(tiny, fitted):
    train, test = tiny
    most_frequent = np.bincount(train.Y.indices, minlength=train.n_labels).argmax()
    baseline = precision_at_k(np.full((test.n_points, 1), most_frequent), test.Y, (1,))["P@1"]
    p1 = fitted.score(test.X, test.Y)
    assert baseline < 0.1
    assert p1 > max(0.3, 5 * baseline), (p1, baseline)
    assert p1 < 1.0
    losses = [h["loss"] for h in fitted.history_]
    assert np.mean(losses[-20:]) < 0.8 * np.mean(losses[:20])


def test_lsh_inference_retrieves_useful_labels(tiny, fitted):
    _, test = tiny
    assert fitted.score(test.X, test.Y, exact=False) > 0.15


@pytest.mark.slow
def test_same_seed_same_model(tiny):
    train, test = tiny
    a = SlideClassifier(**PARAMS).fit(train.X, train.Y)
    b = SlideClassifier(**PARAMS).fit(train.X, train.Y)
    np.testing.assert_array_equal(a.predict_topk(test.X, 5), b.predict_topk(test.X, 5))
    c = SlideClassifier(**{**PARAMS, "seed": 1}).fit(train.X, train.Y)
    assert not np.array_equal(a.predict_topk(test.X, 5), c.predict_topk(test.X, 5))


def test_partial_fit_continues_training(tiny):
    train, test = tiny
    clf = SlideClassifier(**PARAMS)
    scores = []
    for _ in range(3):
        with pytest.warns(NetworkAloneWarning, match="^partial_fit trains the network alone"):
            clf.partial_fit(train.X, train.Y)
        scores.append(clf.score(test.X, test.Y))
    assert clf.n_steps_ == 3 * int(np.ceil(train.n_points / PARAMS["batch_size"]))
    assert clf.epochs_done_ == 3
    assert scores[-1] > scores[0] + 0.1, scores


def test_partial_fit_says_the_fused_parts_are_not_trained(tiny):
    """Once, in a line: a fitted model's fused parts stay as fit built them; without
    neighbours asked there is nothing to say."""
    train, _ = tiny
    clf = SlideClassifier(**{**PARAMS, "epochs": 1}).fit(train.X, train.Y)
    with pytest.warns(NetworkAloneWarning, match="stay as fit built them"):
        clf.partial_fit(train.X, train.Y)
    assert clf.neighbours_ is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SlideClassifier(**{**PARAMS, "neighbours": 0}).partial_fit(train.X, train.Y)


def test_accepts_sparse_arrays_and_label_lists(tiny):
    train, test = tiny
    X, Y = train.X.to_gcxs(), train.Y.to_lists()
    clf = SlideClassifier(**PARAMS).fit(X, Y)
    top = clf.predict_topk(test.X.to_gcxs(), k=3)
    assert top.shape == (test.n_points, 3) and top.dtype == np.int64
    assert clf.predict(test.X).shape == (test.n_points, train.n_labels)  # sparse indicator
    assert top.min() >= 0 and top.max() < train.n_labels


def test_get_and_set_params_round_trip():
    clf = SlideClassifier(**PARAMS)
    params = clf.get_params()
    assert params["L"] == 20 and params["hidden"] == (64,)
    clone = SlideClassifier(**params)
    assert clone.get_params() == params
    clone.set_params(L=7)
    assert clone.L == 7 and "L=7" in repr(clone)
    with pytest.raises(ValueError, match="Invalid parameter 'LL'"):
        clone.set_params(LL=1)


def test_every_config_parameter_is_an_estimator_parameter():
    import dataclasses

    from dslide_dask import SlideConfig

    fields = {f.name for f in dataclasses.fields(SlideConfig)} - {"seed"}
    params = SlideClassifier().get_params()
    assert fields <= set(params)
    defaults = SlideConfig()
    assert all(params[f] == getattr(defaults, f) for f in fields)
    assert params["random_state"] == defaults.seed  # scikit-learn's name for the seed


def test_evaluate_reports_the_xc_metrics_with_training_propensities(tiny):
    from dslide_dask.metrics import label_counts, xc_metrics

    train, test = tiny
    clf = SlideClassifier(epochs=2, **PARAMS).fit(train.X, train.Y)
    scores = clf.evaluate(test.X, test.Y)
    expected = xc_metrics(
        clf.predict_topk(test.X, 5),
        test.Y,
        label_counts=label_counts(train.Y),
        n_train=train.n_points,
    )
    assert scores.keys() == expected.keys() >= {"P@1", "nDCG@3", "PSP@5", "PSnDCG@5"}
    for key, value in expected.items():
        assert scores[key] == pytest.approx(value), key


@pytest.mark.parametrize("method", ["predict", "predict_topk", "evaluate"])
def test_a_url_to_predict_or_evaluate_says_what_reads_storage(fitted, method):
    call = getattr(fitted, method)
    args = ("file:///tmp/rows.txt", None) if method == "evaluate" else ("file:///tmp/rows.txt",)
    with pytest.raises(ValueError, match=r"only fit and partial_fit read data from storage"):
        call(*args)

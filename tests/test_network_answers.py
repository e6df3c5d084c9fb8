"""One pass over the test rows gives the whole model's P@k and its network's."""

import pytest

from dslide_dask import SlideClassifier
from dslide_dask.model.network_answers import metrics_with_network


@pytest.fixture(scope="module")
def fitted(tiny):
    train, test = tiny
    return SlideClassifier(epochs=1, client=False, random_state=0).fit(train.X, train.Y), test


def test_the_networks_p_at_k_from_the_fused_pass_is_its_own(fitted):
    clf, test = fitted
    scores = metrics_with_network(clf.fused_model(), clf.trainer_, test.X, test.Y, (1, 3, 5), True)
    alone = clf.trainer_.evaluate(test)
    for k in (1, 3, 5):
        assert scores[f"network P@{k}"] == pytest.approx(alone[f"P@{k}"], abs=1e-12)
    assert scores["P@1"] == pytest.approx(clf.evaluate(test.X, test.Y)["P@1"], abs=1e-12)
    assert scores["P@1"] != scores["network P@1"]  # two answers, not one twice


def test_approximate_answers_report_no_network_figure(fitted):
    clf, test = fitted
    scores = metrics_with_network(clf.fused_model(), clf.trainer_, test.X, test.Y, (1,), False)
    assert "network P@1" not in scores and "P@1" in scores

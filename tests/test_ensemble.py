"""SlideEnsemble: the rank fusion against a direct reference, and the estimator."""

import numpy as np
import pytest

from dslide_dask import NotFittedError, SlideClassifier
from dslide_dask.data.label_pairs import pairs_matrix
from dslide_dask.ensemble import SlideEnsemble, borda_topk
from dslide_dask.metrics import most_frequent_topk, precision_at_k
from tests.conftest import no_pairs


def borda_reference(lists: list[np.ndarray], k: int) -> np.ndarray:
    out = []
    for rows in zip(*lists, strict=True):
        score, first, position = {}, {}, 0
        for ranked in rows:
            for rank, label in enumerate(ranked):
                if label >= 0:
                    score[label] = score.get(label, 0) + len(ranked) - rank
                    first.setdefault(label, position)
                position += 1
        best = sorted(score, key=lambda label: (-score[label], first[label]))[:k]
        out.append(best + [-1] * (k - len(best)))
    return np.array(out)


def test_borda_fusion_equals_a_direct_count():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_members, k_fuse = rng.integers(1, 4), rng.integers(1, 8)
        n_rows, n_labels = rng.integers(1, 20), rng.integers(2, 15)
        lists = []
        for _ in range(n_members):
            ranked = np.full((n_rows, k_fuse), -1)
            for row in ranked:  # fewer than k_fuse found: -1 padding, as LSH top-k gives
                found = rng.integers(0, min(k_fuse, n_labels) + 1)
                row[:found] = rng.choice(n_labels, found, replace=False)
            lists.append(ranked)
        k = rng.integers(1, k_fuse + 1)
        np.testing.assert_array_equal(borda_topk(lists, k), borda_reference(lists, k))


def test_labels_several_members_rank_high_win():
    a = np.array([[1, 2, 3]])  # points 3, 2, 1
    b = np.array([[4, 2, 3]])
    # 2: 2 + 2; 1 and 4: 3 each, 1 seen first; 3: 1 + 1
    np.testing.assert_array_equal(borda_topk([a, b], 4), [[2, 1, 4, 3]])


@pytest.fixture(scope="module")
def ensemble(tiny):
    train, _ = tiny
    member = SlideClassifier(epochs=2, seed=5, n_threads=2, hidden=(32,), K=3, L=10, range_pow=8)
    model = SlideEnsemble(member, n_models=2)
    yield model.fit(train.X, train.Y)
    model.close()


def test_members_differ_by_seed_and_the_ensemble_learns(ensemble, tiny):
    train, test = tiny
    assert [m.random_state for m in ensemble.members_] == [5, 6]
    w0, w1 = (m.trainer_.network.shards[0].W for m in ensemble.members_)
    assert not np.array_equal(w0, w1)
    scores = ensemble.evaluate(test.X, test.Y)
    assert {"P@1", "P@5", "nDCG@3", "PSP@1", "PSnDCG@5"} <= set(scores)
    baseline = precision_at_k(most_frequent_topk(train.Y, test.n_points, 1), test.Y, [1])["P@1"]
    assert scores["P@1"] > baseline + 0.1
    top = ensemble.predict_topk(test.X, 3)
    fused = borda_topk([m.predict_topk(test.X, 10) for m in ensemble.members_], 3)
    np.testing.assert_array_equal(top, fused)


def test_the_ensemble_leaves_out_the_pairs_it_is_given(ensemble, tiny):
    _, test = tiny
    top = ensemble.predict_topk(test.X, 6)
    first = pairs_matrix(np.arange(len(top)), top[:, 0], len(top), test.n_labels)
    got = ensemble.evaluate(test.X, test.Y, exclude=first)
    assert {name: got[name] for name in ("P@1", "P@5")} == pytest.approx(
        precision_at_k(top[:, 1:], test.Y, [1, 5])
    )
    assert ensemble.evaluate(test.X, test.Y, exclude=no_pairs(len(top), test.n_labels)) == (
        pytest.approx(ensemble.evaluate(test.X, test.Y))
    )


@pytest.mark.slow
def test_one_member_predicts_what_the_model_does(tiny):
    train, test = tiny
    one = SlideEnsemble(SlideClassifier(epochs=1, n_threads=2), n_models=1).fit(train.X, train.Y)
    alone = SlideClassifier(epochs=1, n_threads=2).fit(train.X, train.Y)
    np.testing.assert_array_equal(one.predict_topk(test.X, 5), alone.predict_topk(test.X, 5))


def test_misuse_says_what_is_wrong(tiny):
    train, test = tiny
    with pytest.raises(NotFittedError, match="not fitted"):
        SlideEnsemble().predict_topk(test.X)
    with pytest.raises(ValueError, match="n_models"):
        SlideEnsemble(n_models=0).fit(train.X, train.Y)
    with pytest.raises(ValueError, match="n_estimators"):
        SlideEnsemble().set_params(n_estimators=3)

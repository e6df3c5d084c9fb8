"""How the network's softmax and the neighbours' votes make one ranking: the fusion
kernels and the choice of the weights and the tail exponent, against dense numpy."""

import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import fusion as fusion_kernels
from dslide_dask.model.fusion import choose_weights, filled, fused_topk, softmax_of_top
from tests.test_neighbours import _random_csr


def test_fusion_of_three_lists_is_the_weighted_sum_over_their_union():
    rng = np.random.default_rng(3)
    lists = [
        (rng.permutation(12)[:6].reshape(2, 3), rng.random((2, 3)).astype(np.float32))
        for _ in range(3)
    ]
    weights = np.array([0.5, 0.2, 0.3], np.float32)
    ids = np.stack([i for i, _ in lists])
    scores = np.stack([v for _, v in lists])
    top, got = fusion_kernels.fuse(tuple(ids), tuple(scores), weights, 5)
    for r in range(2):
        want = np.zeros(12)
        for (i, v), w in zip(lists, weights, strict=True):
            np.add.at(want, i[r], w * v[r])
        best = np.argsort(-want, kind="stable")[:5]
        np.testing.assert_allclose(got[r], want[best], rtol=1e-6)
        assert set(top[r]) == set(best) or np.allclose(want[top[r]], want[best])


@pytest.mark.parametrize("k", [1, 4, 20, 300])
def test_fusion_keeps_the_rows_of_a_top_k_walked_from_its_end(k):
    """The fused rows, ties and a top k wider than the candidates included, are those of
    inserting each label's sum into a top k walked from its end (``topk._push``)."""
    from dslide_dask.kernels.topk import _push

    rng = np.random.default_rng(5)
    ids = rng.integers(-1, 30, (3, 50, 40))
    scores = rng.integers(0, 4, (3, 50, 40)).astype(np.float32) / 4  # ties
    weights = np.array([0.5, 0.25, 1.0], np.float32)
    top, got = fusion_kernels.fuse(tuple(ids), tuple(scores), weights, k)
    for i in range(50):
        want_ids, want = np.full(k, -1, np.int64), np.full(k, -np.inf, np.float32)
        labels = ids[:, i].ravel()
        values = (weights[:, None] * scores[:, i]).ravel()[labels >= 0]
        labels = labels[labels >= 0]
        order = np.argsort(labels)
        for lab in np.unique(labels):
            total = 0.0
            for a in order[labels[order] == lab]:
                total += values[a]
            _push.py_func(want_ids, want, lab, total)
        np.testing.assert_array_equal(top[i], want_ids)
        np.testing.assert_array_equal(got[i], want)


def test_fusion_mixes_softmax_and_votes_over_both_candidate_lists():
    net_ids = np.array([[3, 1, 4], [0, 2, -1]])
    logits = np.array([[2.0, 1.0, 0.0], [1.0, 0.5, -np.inf]], np.float32)
    nb_ids = np.array([[4, 9, -1], [5, 0, 2]])
    shares = np.array([[0.75, 0.25, 0.0], [0.5, 0.3, 0.2]], np.float32)
    w = 0.4
    top, scores = fused_topk(net_ids, logits, [(nb_ids, shares)], (w,), 4)
    p = softmax_of_top(logits)
    for i in range(2):
        want = {}
        for lab, pr in zip(net_ids[i], p[i], strict=True):
            if lab >= 0:
                want[lab] = (1 - w) * pr
        for lab, sh in zip(nb_ids[i], shares[i], strict=True):
            if lab >= 0:
                want[lab] = want.get(lab, 0.0) + w * sh
        best = sorted(want.items(), key=lambda kv: -kv[1])[:4]
        assert list(top[i][: len(best)]) == [b[0] for b in best]
        np.testing.assert_allclose(scores[i][: len(best)], [b[1] for b in best], rtol=1e-6)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-6)


def test_the_weight_chosen_is_the_one_that_scores_best():
    truth = CSR(np.array([0, 1, 2]), np.array([7, 8]), None, 10)
    net_ids = np.array([[1, 2], [8, 3]])
    logits = np.array([[0.0, 0.0], [6.0, 0.0]], np.float32)
    nb = (np.array([[7, -1], [3, -1]]), np.array([[1.0, 0.0], [1.0, 0.0]], np.float32))
    # the network alone gets row 1, the votes alone row 0; only w in (1/3, 0.4987) both
    w, tail = choose_weights(net_ids, logits, [nb], truth)
    assert w == pytest.approx((0.4, 0.0)) and tail == 0.0  # no propensities: no boost
    top, _ = fused_topk(net_ids, logits, [nb], w, 1)
    assert list(top[:, 0]) == [7, 8]
    # a second list of votes that alone gets both rows is given weight
    both = (np.array([[7, -1], [8, -1]]), np.array([[1.0, 0.0], [1.0, 0.0]], np.float32))
    w, _ = choose_weights(net_ids, logits, [nb, both], truth)
    assert w[1] > 0 and list(fused_topk(net_ids, logits, [nb, both], w, 1)[0][:, 0]) == [7, 8]


def test_the_tail_boost_multiplies_each_fused_score_by_its_inverse_propensity():
    rng = np.random.default_rng(3)
    net_ids = np.array([[3, 1, 4], [0, 2, -1]])
    logits = np.array([[2.0, 1.0, 0.0], [1.0, 0.5, -np.inf]], np.float32)
    votes = [(np.array([[4, 9, -1], [5, 0, 2]]), rng.random((2, 3)).astype(np.float32))]
    inverse = (1.0 + 9.0 * rng.random(10)).astype(np.float32)
    top, scores = fused_topk(net_ids, logits, votes, (0.3,), 5, 0.3, inverse)
    plain_top, plain = fused_topk(net_ids, logits, votes, (0.3,), 10)
    for i in range(2):
        found = plain_top[i] >= 0
        want = {
            lab: v * inverse[lab] ** 0.3
            for lab, v in zip(plain_top[i][found], plain[i][found], strict=True)
        }
        best = sorted(want.items(), key=lambda kv: -kv[1])[:5]
        assert list(top[i][: len(best)]) == [b[0] for b in best]
        np.testing.assert_allclose(scores[i][: len(best)], [b[1] for b in best], rtol=1e-5)
    with pytest.raises(ValueError, match="inverse propensities"):
        fused_topk(net_ids, logits, votes, (0.3,), 5, 0.3)


def test_a_tail_exponent_is_chosen_where_rare_labels_are_the_right_ones():
    # label 0 is common, 1 rare; the network slightly prefers 0 but the rows are 1's
    truth = CSR(np.array([0, 1, 2]), np.array([1, 1]), None, 2)
    net_ids = np.array([[0, 1], [0, 1]])
    logits = np.array([[0.2, 0.0], [0.2, 0.0]], np.float32)
    nb = (np.full((2, 1), -1), np.zeros((2, 1), np.float32))
    inverse = np.array([1.0, 4.0], np.float32)
    (w, tail) = choose_weights(net_ids, logits, [nb], truth, inverse)
    assert tail > 0 and list(fused_topk(net_ids, logits, [nb], w, 1, tail, inverse)[0][:, 0]) == [
        1,
        1,
    ]
    # given settings are kept
    assert choose_weights(net_ids, logits, [nb], truth, inverse, (0.1, 0.0), 0.0) == (
        (0.1, 0.0),
        0.0,
    )


def test_the_weights_are_scored_as_the_fused_top_5_scores():
    """choose_weights scores every setting on one union of the candidates: the same
    P@k as fusing each setting from the lists."""
    from dslide_dask.metrics import precision_at_k
    from dslide_dask.model import fusion

    rng = np.random.default_rng(5)
    n, labels = 300, 60
    net_ids = np.stack([rng.choice(labels, 20, replace=False) for _ in range(n)])
    logits = rng.normal(size=(n, 20)).astype(np.float32)
    votes = []
    for _ in range(2):
        ids = np.stack([rng.choice(labels, 20, replace=False) for _ in range(n)])
        ids[rng.random(ids.shape) < 0.2] = -1
        votes.append((ids, rng.random((n, 20)).astype(np.float32)))
    Y = _random_csr(rng, n, labels, 3)
    inverse = (1 + 5 * rng.random(labels)).astype(np.float32)
    union, values, _ = fusion._union(*fusion._stacked(net_ids, logits, votes))
    found = union >= 0
    hits = np.where(found, fusion._hits(union, Y), -1).astype(np.int8)
    for pair, tail in [((0.0, 0.0), 0.0), ((0.3, 0.2), 0.0), ((0.1, 0.7), 0.3), ((1.0, 0.0), 0.4)]:
        top, _ = fused_topk(net_ids, logits, votes, pair, 5, tail, inverse)
        want = np.mean(list(precision_at_k(top, Y, (1, 3, 5)).values()))
        boosted = values * inverse[np.where(found, union, 0)] ** np.float32(tail)
        ranks = fusion_kernels.hits_by_rank(boosted, hits, fusion._source_weights(pair), 5)
        got = fusion._mean_precision(ranks, n)
        assert got == pytest.approx(want, abs=1e-9), (pair, tail)


def test_the_label_classifiers_weight_comes_on_top_and_is_chosen_where_they_are_right():
    # the network and the neighbours prefer label 0; the classifiers know it is label 1
    truth = CSR(np.array([0, 1, 2]), np.array([1, 1]), None, 3)
    net_ids = np.array([[0, 1], [0, 1]])
    logits = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    near = (np.array([[0, 2], [0, 2]]), np.array([[0.6, 0.4], [0.6, 0.4]], np.float32))
    hidden = (np.full((2, 0), -1), np.zeros((2, 0), np.float32))
    svm = (np.array([[1, 0], [1, 0]]), np.array([[0.9, 0.1], [0.9, 0.1]], np.float32))
    votes = [near, hidden, svm]
    w, tail = choose_weights(net_ids, logits, votes, truth, None, (0.3, 0.0), 0.0)
    assert w[:2] == (0.3, 0.0) and w[2] > 0  # chosen: the smallest that puts 1 first
    top, scores = fused_topk(net_ids, logits, votes, w, 3, tail)
    assert list(top[:, 0]) == [1, 1]
    p = softmax_of_top(logits)
    want_1 = 0.7 * p[0, 1] + w[2] * 0.9  # the network keeps 1 - 0.3: the third is on top
    np.testing.assert_allclose(scores[0, 0], want_1, rtol=1e-6)
    wrong = (np.array([[2, 0], [2, 0]]), svm[1])  # classifiers naming a wrong label
    w, _ = choose_weights(net_ids, logits, [near, hidden, wrong], truth, None, (0.3, 0.0), 0.0)
    assert w[2] == 0.0


@pytest.mark.parametrize(("n_right", "kept"), [(2, True), (60, False)])
def test_the_prior_weights_stay_unless_the_held_rows_clearly_beat_them(n_right, kept):
    """Of 100 held rows, the network is right on all but ``n_right``; the neighbours on
    all: 2 rows better is noise (the prior, the network alone, stays), 60 is not (the
    neighbours get a weight)."""
    n = 100
    truth = CSR(np.arange(n + 1), np.array([1] * n_right + [0] * (n - n_right)), None, 3)
    net_ids = np.tile([0, 1], (n, 1))
    logits = np.tile(np.array([1.0, 0.0], np.float32), (n, 1))
    near_ids = np.where(np.arange(n)[:, None] < n_right, [1, 2], [0, 2])  # always right
    near = (near_ids, np.tile(np.array([0.9, 0.1], np.float32), (n, 1)))
    prior = ((0.0, 0.0), 0.0)
    free = choose_weights(net_ids, logits, [near], truth, None, None, 0.0)
    assert free[0][0] > 0  # without a prior, any gain moves the weights
    got = choose_weights(net_ids, logits, [near], truth, None, None, 0.0, prior=prior)
    assert (got == prior) is kept, got


def test_a_weighting_is_not_credited_with_candidates_only_an_unasked_source_lists():
    """A served model does not ask a source it weighs 0 (``FusedModel.votes``), so the
    held rows must not score a weighting on the labels only that source names: here the
    right label 5 is named by the input's votes alone (with a tiny share) and the
    centroids would lift it. With the input's weight 0 it is no candidate, and no
    centroids' weight helps; with 0.1 it is, and they get weight."""
    n = 4
    truth = CSR(np.arange(n + 1), np.full(n, 5), None, 6)
    net_ids = np.tile([0, 1], (n, 1))
    logits = np.tile(np.array([5.0, 0.0], np.float32), (n, 1))
    near = (np.tile([5, -1], (n, 1)), np.tile(np.array([0.01, 0.0], np.float32), (n, 1)))
    empty = (np.full((n, 0), -1), np.zeros((n, 0), np.float32))
    cent = (np.tile([0, 1, 5], (n, 1)), np.tile(np.array([0.0, 0.0, 1.0], np.float32), (n, 1)))
    votes = [near, empty, empty, cent]
    w, _ = choose_weights(net_ids, logits, votes, truth, None, (0.0, 0.0), 0.0)
    assert w == (0.0, 0.0, 0.0, 0.0)  # the network alone: label 5 is never offered
    w, _ = choose_weights(net_ids, logits, votes, truth, None, (0.1, 0.0), 0.0)
    assert w[:2] == (0.1, 0.0) and w[3] > 0
    top, _ = fused_topk(net_ids, logits, votes, w, 1)
    assert list(top[:, 0]) == [5] * n
    from dslide_dask.model.fusion import asked

    assert asked((0.0, 0.0, 0.0, 1.0), 4) == (True, False, False, False, False)
    assert asked((0.3, 0.7), 2) == (False, True, True)
    assert asked((0.2, 0.5), 3) == (True, True, True, True)  # the classifiers: unweighed


@pytest.mark.parametrize("loss_dtype", [np.float32, np.float64])
def test_tree_rescored_is_the_head_of_a_stable_sort_ties_and_nan_included(loss_dtype):
    """The re-ranking kernel keeps numpy's stable argsort of the negated products: ties
    in list order, -inf (no candidate) before NaN, NaN last, ``k`` past the width cut."""
    from dslide_dask.model.fusion import tree_rescored

    rng = np.random.default_rng(11)
    ids = rng.integers(-1, 20, (40, 30))
    scores = (rng.integers(0, 4, ids.shape) / 4).astype(np.float32)
    scores[rng.random(ids.shape) < 0.1] = np.nan
    losses = (rng.integers(0, 3, ids.shape) / 2).astype(loss_dtype)
    losses[rng.random(ids.shape) < 0.3] = np.inf
    for k in (1, 5, 30, 50):
        rescored = np.where(ids >= 0, scores * np.exp(-np.float32(0.5) * losses), -np.inf)
        order = np.argsort(-rescored, axis=1, kind="stable")[:, :k]
        top, got = tree_rescored(ids, scores, losses, 0.5, k)
        np.testing.assert_array_equal(top, np.take_along_axis(ids, order, 1))
        want = np.take_along_axis(rescored, order, 1).astype(np.float32)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_a_row_left_short_is_filled_below_its_answers_without_repeating_one():
    ids = np.array([[4, 2, -1, -1], [1, 0, 3, 2], [-1, -1, -1, -1], [5, -1, -1, -1]])
    scores = np.array(
        [
            [0.9, 0.5, -np.inf, -np.inf],
            [4, 3, 2, 1],
            [-np.inf] * 4,
            [-0.5, -np.inf, -np.inf, -np.inf],
        ],
        np.float32,
    )
    short = np.array([0, 2, 3])
    got, got_scores = filled(ids, scores, short, np.array([2, 6, 4, 0]))
    np.testing.assert_array_equal(got, [[4, 2, 6, 0], [1, 0, 3, 2], [2, 6, 4, 0], [5, 2, 6, 4]])
    np.testing.assert_array_equal(got_scores[0], np.float32([0.9, 0.5, 0.0, 0.0]))
    np.testing.assert_array_equal(got_scores[2], [0.0] * 4)
    np.testing.assert_array_equal(got_scores[3], [-0.5] * 4)  # never above an answer
    assert ids[0, 2] == -1  # the caller's arrays are left as they were

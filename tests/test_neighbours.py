"""The neighbour index beside the network: kernels against dense numpy, and the estimator
that fuses the neighbours' votes with the network's softmax."""

import json

import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.data.csr import CSR
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.kernels import neighbours as kernels
from dslide_dask.model.fusion import choose_weights, fused_topk, softmax_of_top
from dslide_dask.model.neighbours import NeighbourIndex

PARAMS = dict(hidden=(64,), K=3, L=20, range_pow=9, lr=1e-2, batch_size=128, seed=0)


def _random_csr(rng, n_rows, n_cols, per_row, binary=False) -> CSR:
    rows = [
        np.sort(rng.choice(n_cols, size=rng.integers(1, per_row + 1), replace=False))
        for _ in range(n_rows)
    ]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    data = None if binary else rng.uniform(0.1, 2.0, int(indptr[-1])).astype(np.float32)
    return CSR(indptr, np.concatenate(rows), data, n_cols)


def _dense(m: CSR) -> np.ndarray:
    out = np.zeros((m.n_rows, m.n_cols), np.float64)
    for i in range(m.n_rows):
        out[i, m.row(i)] = m.values()[m.indptr[i] : m.indptr[i + 1]]
    return out


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-300)


def _assert_votes(ids, shares, sims, labels, k: int) -> None:
    """Each row's votes are those of its ``k`` most similar points of positive
    similarity (``sims``), each voting for its ``labels`` with its similarity."""
    for i in range(len(sims)):
        near = np.argsort(-sims[i], kind="stable")[:k]
        near = near[sims[i, near] > 0]
        want = sims[i, near] @ labels[near] / sims[i, near].sum()
        got = np.zeros(labels.shape[1])
        got[ids[i][ids[i] >= 0]] = shares[i][ids[i] >= 0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_votes_are_the_k_nearest_rows_labels_weighed_by_cosine():
    rng = np.random.default_rng(0)
    X, Y = _random_csr(rng, 300, 40, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 20, 40, 6)
    k, m = 7, 25
    ids, shares = NeighbourIndex.build(X, Y).votes(Q, k, m)
    sims = _unit(_dense(Q)) @ _unit(_dense(X)).T
    _assert_votes(ids, shares, sims, _dense(Y), k)
    for i in range(Q.n_rows):
        assert np.all(np.diff(shares[i][ids[i] >= 0]) <= 1e-7)  # best first
    assert np.allclose(shares.sum(axis=1), 1.0, atol=1e-5) or (ids < 0).any()


def test_votes_in_the_hidden_space_are_those_of_the_nearest_hidden_vectors():
    rng = np.random.default_rng(2)
    X, Y = _random_csr(rng, 300, 40, 6), _random_csr(rng, 300, 25, 3, binary=True)
    hidden = np.maximum(rng.normal(size=(300, 16)), 0).astype(np.float32)  # ReLU outputs
    queries = np.maximum(rng.normal(size=(20, 16)), 0).astype(np.float32)
    k, m = 7, 25
    index = NeighbourIndex.build(X, Y).with_embedding(hidden)
    ids, shares = index.embedding_votes(queries, k, m)
    sims = _unit(queries.astype(np.float64)) @ _unit(hidden.astype(np.float64)).T
    _assert_votes(ids, shares, sims, _dense(Y), k)


@pytest.mark.parametrize("mix", [0.35, 1.0])
def test_hidden_votes_mixed_with_the_input_cosine_are_those_of_the_mixed_similarity(mix):
    rng = np.random.default_rng(3)
    X, Y = _random_csr(rng, 300, 40, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 20, 40, 6)
    hidden = np.maximum(rng.normal(size=(300, 16)), 0).astype(np.float32)
    queries = np.maximum(rng.normal(size=(20, 16)), 0).astype(np.float32)
    k, m = 7, 25
    index = NeighbourIndex.build(X, Y).with_embedding(hidden)
    ids, shares = index.embedding_votes(queries, k, m, Q, mix)
    cos_hidden = _unit(queries.astype(np.float64)) @ _unit(hidden.astype(np.float64)).T
    cos_input = _unit(_dense(Q)) @ _unit(_dense(X)).T
    _assert_votes(ids, shares, (1 - mix) * cos_hidden + mix * cos_input, _dense(Y), k)
    with pytest.raises(ValueError, match="needs the input rows"):
        index.embedding_votes(queries, k, m, None, mix)


def test_fusion_of_three_lists_is_the_weighted_sum_over_their_union():
    rng = np.random.default_rng(3)
    lists = [
        (rng.permutation(12)[:6].reshape(2, 3), rng.random((2, 3)).astype(np.float32))
        for _ in range(3)
    ]
    weights = np.array([0.5, 0.2, 0.3], np.float32)
    ids = np.stack([i for i, _ in lists])
    scores = np.stack([v for _, v in lists])
    top, got = kernels.fuse(ids, scores, weights, 5)
    for r in range(2):
        want = np.zeros(12)
        for (i, v), w in zip(lists, weights, strict=True):
            np.add.at(want, i[r], w * v[r])
        best = np.argsort(-want, kind="stable")[:5]
        np.testing.assert_allclose(got[r], want[best], rtol=1e-6)
        assert set(top[r]) == set(best) or np.allclose(want[top[r]], want[best])


def test_postings_hold_the_normalised_rows_by_column():
    rng = np.random.default_rng(1)
    X = _random_csr(rng, 50, 30, 5)
    ptr, pts, val = kernels.postings(X.indptr, X.indices, X.values(), X.n_cols)
    dense = np.zeros((X.n_rows, X.n_cols))
    for c in range(X.n_cols):
        dense[pts[ptr[c] : ptr[c + 1]], c] = val[ptr[c] : ptr[c + 1]]
    np.testing.assert_allclose(dense, _unit(_dense(X)), rtol=1e-6)


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


def test_the_index_inverse_propensities_are_those_of_its_label_counts():
    from dslide_dask.metrics import propensity

    rng = np.random.default_rng(2)
    X, Y = _random_csr(rng, 40, 20, 4), _random_csr(rng, 40, 12, 3)
    index = NeighbourIndex.build(X, Y)
    counts = np.bincount(Y.indices, minlength=12)
    np.testing.assert_allclose(index.inverse_propensity, 1 / propensity(counts, 40), rtol=1e-6)
    assert index.inverse_propensity[np.argmax(counts)] == index.inverse_propensity.min()


@pytest.fixture(scope="module")
def small():
    return make_synthetic("tiny", seed=0)


@pytest.mark.slow
def test_the_neighbours_add_what_the_network_misses_and_survive_save_and_load(small, tmp_path):
    train, test = small
    alone = SlideClassifier(epochs=2, neighbours=0, client=False, **PARAMS).fit(train.X, train.Y)
    fused = SlideClassifier(epochs=2, client=False, **PARAMS).fit(train.X, train.Y)
    assert fused.neighbours_.n_points == train.n_points  # the held rows joined at the end
    assert fused.neighbours_.embedding.shape == (train.n_points, 64)  # hidden vectors too
    assert len(fused.neighbour_weight_) == 2 and 0.0 <= sum(fused.neighbour_weight_) <= 1.0
    assert alone.neighbours_ is None
    p_alone, p_fused = alone.score(test.X, test.Y), fused.score(test.X, test.Y)
    assert p_fused > p_alone + 0.02, (p_fused, p_alone)
    url = fused.save(str(tmp_path / "model"))
    loaded = SlideClassifier.load(url)
    a = fused.predict_topk(test.X, 5, return_scores=True)
    b = loaded.predict_topk(test.X, 5, return_scores=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert loaded.neighbour_weight_ == fused.neighbour_weight_
    assert loaded.tail_exponent_ == fused.tail_exponent_


def test_a_damaged_neighbour_index_is_named_on_load(small, tmp_path):
    train, _ = small
    url = (
        SlideClassifier(epochs=1, client=False, **PARAMS)
        .fit(train.X, train.Y)
        .save(str(tmp_path / "model"))
    )
    target = tmp_path / "model"
    manifest = next(target.rglob("neighbours/index.json"))
    entries = json.loads(manifest.read_text())
    with open(manifest.parent / "post_pts.npy", "r+b") as f:  # same size, other bytes
        f.seek(-4, 2)
        f.write(b"\xff\xff\xff\x7f")
    with pytest.raises(CheckpointError, match="post_pts.npy: checksum mismatch"):
        SlideClassifier.load(url)
    manifest.write_text(json.dumps({**entries, "n_labels": -1}))
    with pytest.raises(CheckpointError, match="index.json: n_labels"):
        SlideClassifier.load(url)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tail_exponent_", 5.0, r"tail_exponent_ must be in \[0, 0.4\]"),
        ("tail_exponent_", "0.2", r"tail_exponent_ must be in \[0, 0.4\]"),
        ("neighbour_weight_", [0.9, 0.9], "neighbour_weight_ must be two weights"),
    ],
)
def test_damaged_fusion_settings_are_named_on_load(small, tmp_path, key, value, message):
    train, _ = small
    model = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    url = model.save(str(tmp_path / "model"))
    meta = next((tmp_path / "model").rglob("meta.json"))
    saved = json.loads(meta.read_text())
    assert saved["estimator"]["tail_exponent_"] == model.tail_exponent_
    saved["estimator"][key] = value
    meta.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match=message):
        SlideClassifier.load(url)


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
    union, values = fusion._union(*fusion._stacked(net_ids, logits, votes))
    found = union >= 0
    hits = np.where(found, fusion._hits(union, Y), -1).astype(np.int8)
    for pair, tail in [((0.0, 0.0), 0.0), ((0.3, 0.2), 0.0), ((0.1, 0.7), 0.3), ((1.0, 0.0), 0.4)]:
        top, _ = fused_topk(net_ids, logits, votes, pair, 5, tail, inverse)
        want = np.mean(list(precision_at_k(top, Y, (1, 3, 5)).values()))
        boosted = values * inverse[np.where(found, union, 0)] ** np.float32(tail)
        ranks = kernels.hits_by_rank(boosted, hits, fusion._source_weights(pair), 5)
        got = fusion._mean_precision(ranks, n)
        assert got == pytest.approx(want, abs=1e-9), (pair, tail)


def test_served_votes_leave_out_the_features_most_points_hold():
    """The votes of the serving postings are those of the cosine (each side normalised
    over all its features) summed over the features held by at most that share."""
    rng = np.random.default_rng(5)
    X, Y = _random_csr(rng, 300, 40, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 20, 40, 6)
    k, m = 7, 25
    held = (_dense(X) != 0).sum(axis=0)
    share = np.median(held) / 300  # about half the features are left out
    index = NeighbourIndex.build(X, Y)
    served = index.with_serving_postings(share)
    ids, shares = served.votes(Q, k, m)
    kept = held <= share * 300
    assert 0 < kept.sum() < 40
    sims = _unit(_dense(Q)) @ (_unit(_dense(X)) * kept).T
    _assert_votes(ids, shares, sims, _dense(Y), k)
    assert served.state().keys() == index.state().keys()  # nothing more is stored
    np.testing.assert_array_equal(served.post_pts, index.post_pts)


def test_a_model_saved_before_the_mix_loads_with_the_hidden_space_alone(small, tmp_path):
    train, test = small
    model = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    assert model.neighbour_mix == 0.35
    url = model.save(str(tmp_path / "model"))
    meta = next((tmp_path / "model").rglob("meta.json"))
    saved = json.loads(meta.read_text())
    assert saved["estimator"].pop("neighbour_mix") == 0.35
    meta.write_text(json.dumps(saved))
    loaded = SlideClassifier.load(url)
    assert loaded.neighbour_mix == 0.0
    model.neighbour_mix = 0.0
    np.testing.assert_array_equal(loaded.predict_topk(test.X, 5), model.predict_topk(test.X, 5))
    with pytest.raises(ValueError, match="neighbour_mix"):
        SlideClassifier(epochs=1, client=False, neighbour_mix=1.5, **PARAMS).fit(train.X, train.Y)

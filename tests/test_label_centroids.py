"""Label centroids: each label's pruned, normalised sum of its points' unit rows, and the
cosine of a query with its candidates' centroids, against dense numpy."""

import numba
import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.data.csr import CSR
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.kernels.neighbours import normalised
from dslide_dask.model.fusion import CENTROID_WEIGHTS, candidate_union, choose_weights, fused_topk
from dslide_dask.model.label_centroids import LabelCentroids
from dslide_dask.model.neighbours import NeighbourIndex
from tests.test_neighbours import PARAMS, _dense, _random_csr


def _unit(a: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms > 0, norms, 1)


def _labels(rng, n_rows: int, n_labels: int) -> CSR:
    rows = [np.sort(rng.choice(n_labels, rng.integers(0, 4), replace=False)) for _ in range(n_rows)]
    ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    return CSR(ptr, np.concatenate(rows).astype(np.int64), None, n_labels)


def _reference(X: CSR, Y: CSR, prune: float) -> np.ndarray:
    sums = _dense(Y).T @ _unit(_dense(X))
    cent = _unit(sums)
    return np.where(np.abs(cent) >= prune, cent, 0.0)


def _build(X: CSR, Y: CSR, prune: float) -> LabelCentroids:
    rows = (X.indptr, X.indices, normalised(X.indptr, X.values()))
    return LabelCentroids.build(rows, Y.indptr, Y.indices, Y.n_cols, X.n_cols, prune)


@pytest.mark.parametrize("prune", [0.0, 0.1])
def test_centroids_are_the_pruned_normalised_sums_of_their_unit_rows(prune):
    rng = np.random.default_rng(0)
    X, Y = _random_csr(rng, 60, 40, 8), _labels(rng, 60, 25)
    built = _build(X, Y, prune)
    got = np.zeros((Y.n_cols, X.n_cols))
    for lab in range(Y.n_cols):
        s = slice(built.ptr[lab], built.ptr[lab + 1])
        assert np.all(np.diff(built.idx[s]) > 0)  # features ascending, once
        got[lab, built.idx[s]] = built.val[s]
    want = _reference(X, Y, prune)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert len(built.idx) == np.count_nonzero(want)  # nothing under the threshold kept
    assert (np.diff(built.ptr)[_dense(Y).sum(axis=0) == 0] == 0).all()  # no rows: empty


def test_the_same_centroids_whatever_the_threads():
    rng = np.random.default_rng(1)
    X, Y = _random_csr(rng, 200, 50, 10), _labels(rng, 200, 30)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _build(X, Y, 0.01)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = _build(X, Y, 0.01)
    finally:
        numba.set_num_threads(before)
    for a, b in ((one.ptr, two.ptr), (one.idx, two.idx), (one.val, two.val)):
        np.testing.assert_array_equal(a, b)


def test_cosines_with_candidates_equal_dense_products():
    rng = np.random.default_rng(2)
    X, Y = _random_csr(rng, 80, 300, 150), _labels(rng, 80, 12)  # centroids of hundreds
    built = _build(X, Y, 0.0)
    Q = _random_csr(rng, 9, 300, 5)  # queries of a few features
    Q2 = _random_csr(rng, 9, 300, 290)  # of most
    ids = rng.integers(-1, 12, (9, 7))
    want_cent = _reference(X, Y, 0.0)
    for q in (Q, Q2):
        query = (q.indptr, q.indices, normalised(q.indptr, q.values()))
        got = built.cosines(query, ids)
        want = _unit(_dense(q)) @ want_cent.T
        expected = np.where(ids >= 0, np.take_along_axis(want, np.maximum(ids, 0), 1), 0.0)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"candidate label is out of range \[0, 12\)"):
        built.cosines(query, np.array([[12]]))


def test_the_index_derives_centroids_from_its_rows_and_scores_candidates():
    rng = np.random.default_rng(3)
    X, Y = _random_csr(rng, 50, 30, 6), _labels(rng, 50, 10)
    index = NeighbourIndex.build(X, Y)
    with pytest.raises(ValueError, match="no label centroids"):
        index.centroid_votes(X, np.zeros((50, 1), np.int64))
    index = index.with_centroids()
    assert index.with_centroids() is index
    assert "centroids" not in {k for k in index.state()}  # derived, never stored
    ids = np.tile(np.arange(10), (50, 1))
    got_ids, cos = index.centroid_votes(X, ids)
    np.testing.assert_array_equal(got_ids, ids)
    want = _unit(_dense(X)) @ _reference(X, Y, 0.01).T
    np.testing.assert_allclose(cos, want, atol=1e-5)
    assert index.with_embedding(np.ones((50, 4))).centroids is index.centroids  # carried


def test_candidate_union_lists_each_label_once():
    net = np.array([[3, 1, -1], [0, 0, 2]])
    votes = [(np.array([[1, 7], [-1, -1]]), np.zeros((2, 2), np.float32))]
    got = candidate_union(net, votes)
    assert got.shape == (2, 3)
    assert sorted(got[0]) == [1, 3, 7]
    assert sorted(got[1][got[1] >= 0]) == [0, 2] and got[1, 2] == -1


def test_the_centroids_weight_is_chosen_where_they_are_right_and_zero_where_not():
    # the network and the neighbours prefer label 0; the centroids know it is label 1
    truth = CSR(np.array([0, 1, 2]), np.array([1, 1]), None, 3)
    net_ids = np.array([[0, 1], [0, 1]])
    logits = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    near = (np.array([[0, 2], [0, 2]]), np.array([[0.6, 0.4], [0.6, 0.4]], np.float32))
    none = (np.full((2, 0), -1), np.zeros((2, 0), np.float32))
    ids = candidate_union(net_ids, [near])
    right = (ids, np.where(ids == 1, 0.9, 0.1).astype(np.float32))
    votes = [near, none, none, right]
    w, tail = choose_weights(net_ids, logits, votes, truth, None, (0.3, 0.0), 0.0)
    assert len(w) == 4 and w[:3] == (0.3, 0.0, 0.0) and w[3] > 0
    top, scores = fused_topk(net_ids, logits, [near, none, none, right], w, 3, tail)
    assert list(top[:, 0]) == [1, 1]
    wrong = (ids, np.where(ids == 2, 0.9, 0.1).astype(np.float32))
    w, _ = choose_weights(net_ids, logits, [near, none, none, wrong], truth, None, (0.3, 0.0), 0.0)
    assert w[3] == 0.0


@pytest.fixture(scope="module")
def small():
    return make_synthetic("tiny", seed=0)


def test_the_centroids_weight_is_given_chosen_or_off(small):
    train, _ = small
    off = SlideClassifier(
        epochs=1, label_centroids=0, label_classifiers=100, client=False, **PARAMS
    )
    off.fit(train.X, train.Y)
    assert off.neighbours_.centroids is None and len(off.neighbour_weight_) == 3
    chosen = SlideClassifier(epochs=1, label_centroids=None, client=False, **PARAMS)
    chosen.fit(train.X, train.Y)
    assert chosen.neighbours_.centroids is not None
    assert chosen.neighbour_weight_[3] in CENTROID_WEIGHTS
    with pytest.raises(ValueError, match=r"label_centroids must be a number in \[0.0, 2.0\]"):
        SlideClassifier(label_centroids=3.0, client=False, **PARAMS).fit(train.X, train.Y)

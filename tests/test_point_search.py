"""The search over the training points' hidden vectors (faiss IVF, the points it proposes
scored exactly): its votes against a dense numpy reference, and a served model using it."""

import pickle

import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.data.csr import CSR
from dslide_dask.kernels import hidden_votes
from dslide_dask.model import fused
from dslide_dask.model.neighbours import NeighbourIndex
from dslide_dask.model.output_index import IndexSettings

pytest.importorskip("faiss", reason='the point search needs faiss: pip install -e ".[test]"')


def _labels(rng, n_points: int, n_labels: int) -> CSR:
    rows = [
        np.sort(rng.choice(n_labels, rng.integers(1, 4), replace=False)) for _ in range(n_points)
    ]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    return CSR(indptr, np.concatenate(rows), None, n_labels)


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _reference(query, points, allowed, Y: CSR, k: int) -> np.ndarray:
    """Each query's vote over labels (dense): its ``k`` most similar allowed points of
    positive cosine, each voting for its labels with its similarity, shares of the sum."""
    sims = np.where(allowed, _unit(query) @ _unit(points).T, -np.inf)
    labels = np.zeros((Y.n_rows, Y.n_cols))
    for p in range(Y.n_rows):
        labels[p, Y.row(p)] = 1.0
    out = np.zeros((len(query), Y.n_cols))
    for i in range(len(query)):
        near = np.argsort(-sims[i], kind="stable")[:k]
        near = near[sims[i, near] > 0]
        out[i] = sims[i, near] @ labels[near] / sims[i, near].sum()
    return out


def _as_dense(ids, shares, n_labels) -> np.ndarray:
    out = np.zeros((len(ids), n_labels))
    for i in range(len(ids)):
        out[i, ids[i][ids[i] >= 0]] = shares[i][ids[i] >= 0]
    return out


def test_candidate_votes_are_the_nearest_candidates_labels_weighed_by_cosine():
    rng = np.random.default_rng(0)
    points = _unit(rng.normal(size=(200, 12))).astype(np.float32)
    query = _unit(rng.normal(size=(15, 12))).astype(np.float32)
    Y = _labels(rng, 200, 30)
    cand = np.stack([rng.permutation(200)[:40] for _ in range(15)])
    cand[:, -5:] = -1  # fewer than asked
    ids, shares = hidden_votes.candidate_neighbour_votes(
        query, points, cand, Y.indptr, Y.indices, 6, 20, np.zeros(cand.shape, np.float32), 0.0
    )
    allowed = np.zeros((15, 200), bool)
    for i in range(15):
        allowed[i, cand[i][cand[i] >= 0]] = True
    want = _reference(query, points, allowed, Y, 6)
    np.testing.assert_allclose(_as_dense(ids, shares, 30), want, rtol=1e-4, atol=1e-6)


def test_a_search_proposing_every_point_votes_as_scoring_every_point():
    rng = np.random.default_rng(1)
    hidden = np.maximum(rng.normal(size=(300, 16)), 0).astype(np.float32)
    queries = np.maximum(rng.normal(size=(25, 16)), 0).astype(np.float32)
    Y = _labels(rng, 300, 40)
    X = CSR(np.arange(301), np.zeros(300, np.int64), None, 1)
    index = NeighbourIndex.build(X, Y).with_embedding(hidden)
    every = index.with_search(IndexSettings(lists=4, probes=4, candidates=300))
    assert index.search is None and every.search is not None
    want = _as_dense(*index.embedding_votes(queries, 7, 30), 40)
    np.testing.assert_allclose(
        _as_dense(*every.embedding_votes(queries, 7, 30), 40), want, atol=1e-5
    )
    allowed = np.ones((25, 300), bool)
    np.testing.assert_allclose(want, _reference(queries, hidden, allowed, Y, 7), atol=1e-5)
    rows = CSR(np.arange(26), rng.integers(0, 1, 25), None, 1)  # one feature: cosine 1
    mixed = _as_dense(*index.embedding_votes(queries, 7, 30, rows, 0.5), 40)
    np.testing.assert_allclose(
        _as_dense(*every.embedding_votes(queries, 7, 30, rows, 0.5), 40), mixed, atol=1e-5
    )
    assert every.with_embedding(hidden).search is None  # new vectors: the search is stale


def test_a_search_over_a_few_cells_finds_most_of_the_nearest_points():
    """Points in 32 clusters, 16 cells of which 4 are probed: the votes' best labels are
    nearly those of every point scored."""
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(32, 24))
    member = rng.integers(0, 32, 4000)
    hidden = (centres[member] + 0.3 * rng.normal(size=(4000, 24))).astype(np.float32)
    Y = CSR(np.arange(4001), member, None, 32)  # a point's label: its cluster
    queries = (centres[rng.integers(0, 32, 200)] + 0.3 * rng.normal(size=(200, 24))).astype(
        np.float32
    )
    X = CSR(np.arange(4001), np.zeros(4000, np.int64), None, 1)
    index = NeighbourIndex.build(X, Y).with_embedding(hidden)
    exact, _ = index.embedding_votes(queries, 20, 5)
    found, _ = index.with_search(IndexSettings(lists=16, probes=4)).embedding_votes(queries, 20, 5)
    assert (found[:, 0] == exact[:, 0]).mean() >= 0.95
    one = index.with_search(IndexSettings(lists=16, probes=1, candidates=1))
    _, shares = one.embedding_votes(queries, 20, 5)
    np.testing.assert_allclose(shares[:, 0], 1.0, rtol=1e-6)  # one point proposed: one voter
    near = np.tile(np.arange(4000), (200, 1))  # every point given besides: all scored, once
    ids, shares = one.embedding_votes(queries, 20, 5, near=near)
    want_ids, want_shares = index.embedding_votes(queries, 20, 5)
    want = _as_dense(want_ids, want_shares, 32)
    np.testing.assert_allclose(_as_dense(ids, shares, 32), want, atol=1e-5)


def test_a_served_model_searches_its_points_and_again_after_load(tiny, tmp_path, monkeypatch):
    train, test = tiny
    params = {"hidden": (32,), "epochs": 1, "client": False, "random_state": 0}
    clf = SlideClassifier(**params, neighbour_weight=(0.0, 0.5)).fit(train.X, train.Y)
    X = test.X.slice_rows(0, 300)
    clf.build_index(lists=16, probes=16)
    assert clf.neighbours_.search is None  # 4,500 points: every one scored
    monkeypatch.setattr(fused, "MIN_POINTS", 1000)
    clf.build_index(lists=16, probes=16)
    search = clf.neighbours_.search
    assert search is not None and search.settings.lists == 64 and search.settings.probes == 16
    top = clf.predict_topk(X, 5)
    back = SlideClassifier.load(clf.save(str(tmp_path / "model")))
    assert back.neighbours_.search.settings == search.settings  # made again from the vectors
    np.testing.assert_array_equal(back.predict_topk(X, 5), top)
    assert clf.neighbours_.serving is not None  # the input's votes from the serving postings
    copy = pickle.loads(pickle.dumps(clf))  # scikit-learn's tools pickle estimators
    np.testing.assert_array_equal(copy.predict_topk(X, 5), top)

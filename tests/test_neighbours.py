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
from dslide_dask.model.fusion import fused_topk
from dslide_dask.model.label_centroids import SCORED
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
        if len(near) == 0:
            assert np.all(ids[i] == -1)  # no point shares a feature: no vote
            continue
        want = sims[i, near] @ labels[near] / sims[i, near].sum()
        got = np.zeros(labels.shape[1])
        got[ids[i][ids[i] >= 0]] = shares[i][ids[i] >= 0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("n_features, dense", [(16, True), (4000, False)])
def test_votes_are_the_k_nearest_rows_labels_weighed_by_cosine(n_features, dense):
    rng = np.random.default_rng(0)
    X, Y = _random_csr(rng, 300, n_features, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 40, n_features, 6)
    k, m = 7, 25
    index = NeighbourIndex.build(X, Y)
    # A query whose postings reach many points is scanned densely, the others point by point.
    reach = np.add.reduceat(np.diff(index.post_ptr)[Q.indices], Q.indptr[:-1])
    assert np.all(reach * kernels.DENSE_REACH >= X.n_rows) == dense
    assert np.any(reach * kernels.DENSE_REACH >= X.n_rows) == dense
    ids, shares = index.votes(Q, k, m)
    assert (ids[:, 0] >= 0).sum() >= Q.n_rows // 4  # rows with votes to compare
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


@pytest.mark.parametrize(("mix", "n_features"), [(0.35, 40), (1.0, 40), (0.35, 600)])
def test_hidden_votes_mixed_with_the_input_cosine_are_those_of_the_mixed_similarity(
    mix, n_features
):  # 600 features: a query's postings reach few points, summed point by point
    rng = np.random.default_rng(3)
    X, Y = _random_csr(rng, 300, n_features, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 20, n_features, 6)
    hidden = np.maximum(rng.normal(size=(300, 16)), 0).astype(np.float32)
    queries = np.maximum(rng.normal(size=(20, 16)), 0).astype(np.float32)
    k, m = 7, 25
    index = NeighbourIndex.build(X, Y).with_embedding(hidden)
    ids, shares = index.embedding_votes(queries, k, m, Q, mix)
    cos_hidden = _unit(queries.astype(np.float64)) @ _unit(hidden.astype(np.float64)).T
    cos_input = _unit(_dense(Q)) @ _unit(_dense(X)).T
    _assert_votes(ids, shares, (1 - mix) * cos_hidden + mix * cos_input, _dense(Y), k)
    inputs, mixed = index.mixed_votes(queries, k, m, Q, mix)  # one pass over the postings
    for got, want in zip((*inputs, *mixed), (*index.votes(Q, k, m), ids, shares), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="needs the input rows"):
        index.embedding_votes(queries, k, m, None, mix)


def test_postings_hold_the_normalised_rows_by_column():
    rng = np.random.default_rng(1)
    X = _random_csr(rng, 50, 30, 5)
    ptr, pts, val = kernels.postings(X.indptr, X.indices, X.values(), X.n_cols)
    dense = np.zeros((X.n_rows, X.n_cols))
    for c in range(X.n_cols):
        dense[pts[ptr[c] : ptr[c + 1]], c] = val[ptr[c] : ptr[c + 1]]
    np.testing.assert_allclose(dense, _unit(_dense(X)), rtol=1e-6)


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
    fused = SlideClassifier(epochs=2, label_classifiers=100, client=False, **PARAMS)
    fused.fit(train.X, train.Y)
    assert fused.neighbours_.n_points == train.n_points  # the held rows joined at the end
    assert fused.neighbours_.embedding.shape == (train.n_points, 64)  # hidden vectors too
    assert fused.neighbours_.classifiers is not None  # 20 labels of the tiny preset
    assert fused.neighbours_.centroids.n_labels == train.n_labels
    assert len(fused.neighbour_weight_) == 4 and 0.0 <= sum(fused.neighbour_weight_[:2]) <= 1.0
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
    for name, array in fused.neighbours_.classifiers.state().items():
        np.testing.assert_array_equal(loaded.neighbours_.classifiers.state()[name], array)
    np.testing.assert_array_equal(loaded.neighbours_.centroids.val, fused.neighbours_.centroids.val)


def _refuse(*args, **kwargs):
    raise AssertionError("a source of weight 0 was asked for its votes")


@pytest.mark.parametrize(
    "weight",
    [(0.4, 0.0, 0.5, 0.25), (0.0, 0.4, 0.5, 0.25), (0.3, 0.3, 0.0, 0.25), (0.3, 0.3, 0.5, 0.0)],
)
def test_a_source_of_weight_0_is_not_asked_and_changes_no_answer(small, weight, monkeypatch):
    train, test = small
    clf = SlideClassifier(
        epochs=1,
        neighbour_weight=weight[:2],
        tail_exponent=0.2,
        label_classifiers=100,
        label_tree=0,
        client=False,
        **PARAMS,
    ).fit(train.X, train.Y)
    assert clf.neighbour_weight_ == (*weight[:2], 0.5, 0.5)  # the defaults when not chosen
    clf.neighbour_weight_ = weight
    X, index = test.X.slice_rows(0, 200), clf.neighbours_
    k, m = clf._neighbour_k(), clf._candidates()
    ids, logits = clf._network_topk(X, m, True)
    asked = [
        index.votes(X, k, m),
        index.embedding_votes(clf.trainer_.embed(X), k, m, X, clf.neighbour_mix),
        index.classifier_votes(X, m),
    ]
    none = (np.full((X.n_rows, 0), -1, np.int64), np.zeros((X.n_rows, 0), np.float32))
    asked = [votes if w > 0 else none for votes, w in zip(asked, weight, strict=False)]
    inverse = index.inverse_propensity
    best, _ = fused_topk(ids, logits, asked, weight[:3], SCORED, 0.2, inverse)  # the others'
    asked.append(index.centroid_votes(X, best))
    want = fused_topk(ids, logits, asked, weight, 5, 0.2, inverse)
    names = ["votes", "embedding_votes", "classifier_votes", "centroid_votes"]
    monkeypatch.setattr(NeighbourIndex, names[weight.index(0.0)], _refuse)
    got = clf.predict_topk(X, 5, return_scores=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_a_network_the_votes_leave_no_weight_is_not_asked(small, monkeypatch):
    train, test = small
    weight = (0.6, 0.4, 0.0, 0.5)
    clf = SlideClassifier(
        epochs=1, neighbour_weight=weight[:2], label_tree=0, client=False, **PARAMS
    ).fit(train.X, train.Y)
    clf.neighbour_weight_ = weight
    X, index = test.X.slice_rows(0, 200), clf.neighbours_
    k, m = clf._neighbour_k(), clf._candidates()
    none = (np.full((X.n_rows, 0), -1, np.int64), np.zeros((X.n_rows, 0), np.float32))
    asked = [
        index.votes(X, k, m),
        index.embedding_votes(clf.trainer_.embed(X), k, m, X, clf.neighbour_mix),
    ]
    best, _ = fused_topk(*none, asked, weight[:3], SCORED)
    asked += [none, index.centroid_votes(X, best)]
    want = fused_topk(*none, asked, weight, 5)
    assert (want[0] >= 0).all()  # the votes alone fill every row's top 5
    monkeypatch.setattr(type(clf), "_network_topk", _refuse)
    got = clf.predict_topk(X, 5, return_scores=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_a_damaged_neighbour_index_is_named_on_load(small, tmp_path):
    train, _ = small
    url = (
        SlideClassifier(epochs=1, label_classifiers=100, client=False, **PARAMS)
        .fit(train.X, train.Y)
        .save(str(tmp_path / "model"))
    )
    target = tmp_path / "model"
    manifest = next(target.rglob("neighbours/index.json"))
    entries = json.loads(manifest.read_text())
    arrays = {k: v for k, v in entries["arrays"].items() if k != "classifier_bias"}
    manifest.write_text(json.dumps({**entries, "arrays": arrays}))  # one classifier array gone
    with pytest.raises(CheckpointError, match=r"index.json: neighbour index: classifier arrays"):
        SlideClassifier.load(url)
    manifest.write_text(json.dumps(entries))
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
        ("tail_exponent", 5.0, r"tail_exponent must be in \[0, 0.4\]"),
        ("tail_exponent", "0.2", r"tail_exponent must be in \[0, 0.4\]"),
        ("neighbour_weight", [0.9, 0.9], "neighbour_weight must be two weights"),
        ("neighbour_weight", [0.2, 0.2, 3.0], "the label classifiers' in \\[0, 1\\]"),
        ("neighbour_weight", [0.2, 0.2, 0.5, 3.0], "the centroids' in \\[0, 2.0\\]"),
        ("neighbours", 1e12, r"neighbours must be an integer in \[1, 65536\]"),
        ("label_tree", -1, r"label_tree must be in \[0, 2.0\]"),
    ],
)
def test_damaged_fusion_settings_are_named_on_load(small, tmp_path, key, value, message):
    train, _ = small
    model = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    url = model.save(str(tmp_path / "model"))
    meta = next((tmp_path / "model").rglob("meta.json"))
    saved = json.loads(meta.read_text())
    assert saved["fusion"]["tail_exponent"] == model.tail_exponent_
    saved["fusion"][key] = value
    meta.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match=r"meta.json: .*" + message):
        SlideClassifier.load(url)


def test_a_model_saved_before_the_fusion_block_loads_its_estimators_settings(small, tmp_path):
    """Models saved before the fusion had a block of its own kept its weights in the
    estimator's (``neighbour_weight_``, ``tail_exponent_`` and the parameters)."""
    train, test = small
    model = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    url = model.save(str(tmp_path / "model"))
    meta = next((tmp_path / "model").rglob("meta.json"))
    saved = json.loads(meta.read_text())
    fusion = saved.pop("fusion")
    saved["estimator"].update(
        neighbour_weight_=fusion["neighbour_weight"], tail_exponent_=fusion["tail_exponent"]
    )
    meta.write_text(json.dumps(saved))
    again = SlideClassifier.load(url)
    assert again.neighbour_weight_ == model.neighbour_weight_
    np.testing.assert_array_equal(again.predict_topk(test.X), model.predict_topk(test.X))
    saved["estimator"]["neighbour_weight_"] = [0.9, 0.9]
    meta.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match="meta.json: neighbour_weight_ must be two weights"):
        SlideClassifier.load(url)


@pytest.mark.parametrize("rescored", [10, 300])
def test_served_votes_rescore_exactly_the_points_the_uncommon_features_find(rescored):
    """A served row's neighbours are the ``k`` nearest by the exact cosine of the
    ``rescored`` points nearest by the cosine over the features held by at most the
    share given (each side normalised over all its features)."""
    rng = np.random.default_rng(5)
    X, Y = _random_csr(rng, 300, 40, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 20, 40, 6)
    k, m = 7, 25
    held = (_dense(X) != 0).sum(axis=0)
    share = np.median(held) / 300  # about half the features are left out
    index = NeighbourIndex.build(X, Y)
    served = index.with_serving_postings(share, rescored)
    ids, shares, points = served.votes_and_points(Q, k, m)
    kept = held <= share * 300
    assert 0 < kept.sum() < 40
    exact = _unit(_dense(Q)) @ _unit(_dense(X)).T
    found = _unit(_dense(Q)) @ (_unit(_dense(X)) * kept).T
    proposed = np.argsort(-found, axis=1, kind="stable")[:, :rescored]
    sims = np.zeros_like(exact)
    for i, row in enumerate(proposed):
        row = row[found[i, row] > 0]
        sims[i, row] = exact[i, row]
    _assert_votes(ids, shares, sims, _dense(Y), k)
    assert np.all((points >= 0).sum(axis=1) == np.minimum(k, (sims > 0).sum(axis=1)))
    reached = np.where(found > 0, exact, 0.0)  # every point the uncommon features reach
    assert np.allclose(sims, reached) == (rescored >= X.n_rows)
    assert served.state().keys() == index.state().keys()  # nothing more is stored
    np.testing.assert_array_equal(served.post_pts, index.post_pts)


def test_a_model_saved_before_the_mix_loads_with_the_hidden_space_alone(small, tmp_path):
    train, test = small
    model = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    assert model.neighbour_mix == 0.35
    url = model.save(str(tmp_path / "model"))
    meta = next((tmp_path / "model").rglob("meta.json"))
    saved = json.loads(meta.read_text())
    fusion = saved.pop("fusion")  # as saved then: the weights in the estimator's block
    saved["estimator"].update(
        neighbour_weight_=fusion["neighbour_weight"], tail_exponent_=fusion["tail_exponent"]
    )
    assert saved["estimator"].pop("neighbour_mix") == 0.35
    meta.write_text(json.dumps(saved))
    loaded = SlideClassifier.load(url)
    assert loaded.neighbour_mix == 0.0
    model.neighbour_mix = 0.0
    np.testing.assert_array_equal(loaded.predict_topk(test.X, 5), model.predict_topk(test.X, 5))
    with pytest.raises(ValueError, match="neighbour_mix"):
        SlideClassifier(epochs=1, client=False, neighbour_mix=1.5, **PARAMS).fit(train.X, train.Y)


def test_served_input_cosines_of_candidates_are_the_exact_cosines():
    """Mixing the input into the hidden similarity of the points a search proposes reads
    their cosines from the points' rows once served: the cosines of every feature."""
    rng = np.random.default_rng(7)
    X, Y = _random_csr(rng, 300, 40, 6), _random_csr(rng, 300, 25, 3, binary=True)
    Q = _random_csr(rng, 20, 40, 6)
    found = np.stack([rng.permutation(300)[:50] for _ in range(20)])
    found[:, -5:] = -1
    served = NeighbourIndex.build(X, Y).with_serving_postings(0.05)
    bounds = zip(Q.indptr[:-1], Q.indptr[1:], strict=True)
    order = np.concatenate([np.arange(b - 1, a - 1, -1) for a, b in bounds])
    backwards = CSR(Q.indptr, Q.indices[order], Q.values()[order], Q.n_cols)  # any order
    query = served._query(backwards)
    got = kernels.row_cosines(*query, *served.serving.rows, found, served.n_features)
    want = np.take_along_axis(_unit(_dense(Q)) @ _unit(_dense(X)).T, np.maximum(found, 0), 1)
    np.testing.assert_allclose(got, np.where(found >= 0, want, 0.0), rtol=1e-5, atol=1e-6)

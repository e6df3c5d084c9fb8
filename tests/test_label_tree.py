"""The label tree: balanced splits of the labels by their centroids, each node's children's
classifiers, and the losses on a candidate's path, against dense numpy and scikit-learn."""

import json

import numba
import numpy as np
import pytest
from sklearn.svm import LinearSVC

from dslide_dask import SlideClassifier
from dslide_dask.checkpoint import CheckpointError
from dslide_dask.data.csr import CSR
from dslide_dask.kernels import label_tree as kernels
from dslide_dask.kernels.neighbours import normalised, transpose
from dslide_dask.kernels.tree_query import UNSEEN
from dslide_dask.model import label_tree
from dslide_dask.model.fused import RERANKED
from dslide_dask.model.fusion import tree_rescored
from dslide_dask.model.label_centroids import LabelCentroids
from dslide_dask.model.label_tree import (
    LabelTree,
    build_forest,
    classifier_depths,
    halvings,
    leaf_depth,
    mostly_rare,
    trees_for,
)
from tests.test_label_centroids import _labels, small  # noqa: F401 (a fixture)
from tests.test_neighbours import PARAMS, _dense, _random_csr


def _unit_rows(X: CSR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return X.indptr, X.indices, normalised(X.indptr, X.values())


def _tree(X: CSR, Y: CSR, seed: int = 0) -> LabelTree:
    rows = _unit_rows(X)
    centroids = LabelCentroids.build(rows, Y.indptr, Y.indices, Y.n_cols, X.n_cols)
    return LabelTree.build(rows, Y.indptr, Y.indices, centroids, seed)


def test_the_shape_of_the_tree_follows_from_the_number_of_labels():
    assert [leaf_depth(n) for n in (1, 100, 101, 200, 201, 26_556, 670_091)] == [
        0,
        0,
        1,
        1,
        2,
        9,
        13,
    ]
    assert classifier_depths(0) == [0]
    assert classifier_depths(9) == [0, 3, 9]
    assert classifier_depths(12) == [0, 6, 12]
    assert classifier_depths(13) == [0, 1, 7, 13]
    bounds = halvings(11, 2)
    assert list(bounds) == [0, 2, 5, 8, 11]  # each node's first child: its size // 2
    assert set(halvings(11, 1)) <= set(bounds)


def test_a_split_puts_each_of_two_clear_clusters_in_its_own_half():
    rng = np.random.default_rng(0)
    # 16 labels: 8 use features 0-9 only, 8 features 10-19 only; nodes of 16 and of 6
    cols = [rng.choice(10, 4, replace=False) + 10 * (lab % 2) for lab in range(16)]
    rows = [np.sort(c) for c in cols]
    c_ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    c_idx = np.concatenate(rows).astype(np.int64)
    c_val = np.full(len(c_idx), 0.5, np.float32)
    for seed in range(5):
        perm = np.arange(16, dtype=np.int64)
        kernels.split_level(c_ptr, c_idx, c_val, perm, np.array([0, 16]), 20, 6, seed, 2)
        assert sorted(perm) == list(range(16))
        halves = {frozenset(perm[:8] % 2), frozenset(perm[8:] % 2)}
        assert halves == {frozenset({0}), frozenset({1})}


def _reference_split(C: np.ndarray, seed: int, node: int, rounds: int) -> np.ndarray:
    """A node's balanced spherical 2-means in dense numpy: the order of its labels."""
    size, half = len(C), len(C) // 2
    r = kernels._mix(np.uint64((seed * 0x9E3779B97F4A7C15 + node) % 2**64))
    c0 = C[int(r % np.uint64(size))]
    c1 = C[np.argmin(C @ c0)]
    order, halves = np.arange(size), None
    for _ in range(rounds):
        order = order[np.argsort(C[order] @ (c1 - c0), kind="mergesort")]
        if halves is not None and set(order[:half]) == halves:
            break  # the next round would be the same
        halves = set(order[:half])
        c0, c1 = C[order[:half]].sum(0), C[order[half:]].sum(0)
        c0, c1 = c0 / np.linalg.norm(c0), c1 / np.linalg.norm(c1)
    return order


@pytest.mark.parametrize("rounds", [1, 2, 6, 40])
def test_a_split_is_the_dense_balanced_spherical_2_means(rounds):
    rng = np.random.default_rng(3)
    ptr, idx, val = _unit_rows(_random_csr(rng, 37, 30, 6))
    C = _dense(CSR(ptr, idx, val, 30)).astype(np.float32)
    for seed in range(4):
        perm = np.arange(37, dtype=np.int64)
        kernels.split_level(ptr, idx, val, perm, np.array([0, 37]), 30, rounds, seed, 1)
        np.testing.assert_array_equal(perm, _reference_split(C, seed, 0, rounds))


def test_the_same_tree_whatever_the_threads():
    rng = np.random.default_rng(1)
    X, Y = _random_csr(rng, 300, 60, 8), _labels(rng, 300, 250)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _tree(X, Y)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = _tree(X, Y)
    finally:
        numba.set_num_threads(before)
    for name, array in one.state().items():
        np.testing.assert_array_equal(array, two.state()[name], err_msg=name)


def test_a_forest_built_side_by_side_holds_the_trees_built_one_by_one():
    rng = np.random.default_rng(4)
    X, Y = _random_csr(rng, 300, 60, 8), _labels(rng, 300, 250)
    rows = _unit_rows(X)
    centroids = LabelCentroids.build(rows, Y.indptr, Y.indices, Y.n_cols, X.n_cols)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        forest = build_forest(rows, Y.indptr, Y.indices, centroids, [0, 1 << 20, 2 << 20])
        assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    finally:
        numba.set_num_threads(before)
    assert len(forest) == 3
    for tree, seed in zip(forest, (0, 1 << 20, 2 << 20), strict=True):
        alone = _tree(X, Y, seed)
        for name, array in alone.state().items():
            np.testing.assert_array_equal(array, tree.state()[name], err_msg=name)
    assert not np.array_equal(forest[0].perm, forest[1].perm)  # the seeds differ


def test_the_workqueue_threading_layer_builds_a_forest_one_tree_at_a_time(monkeypatch):
    """It cannot run parallel kernels from two threads at once (numba aborts)."""
    rng = np.random.default_rng(5)
    X, Y = _random_csr(rng, 200, 40, 6), _labels(rng, 200, 120)
    rows = _unit_rows(X)
    centroids = LabelCentroids.build(rows, Y.indptr, Y.indices, Y.n_cols, X.n_cols)

    def no_pool(*args, **kwargs):
        raise AssertionError("a pool of threads under the workqueue layer")

    monkeypatch.setattr(label_tree.numba, "threading_layer", lambda: "workqueue")
    monkeypatch.setattr(label_tree, "ThreadPoolExecutor", no_pool)
    forest = build_forest(rows, Y.indptr, Y.indices, centroids, [0, 1 << 20])
    assert np.array_equal(forest[1].perm, _tree(X, Y, 1 << 20).perm)


def test_a_nodes_classifiers_are_the_l2_loss_svms_of_its_rows():
    """One node over every label: its children's classifiers, run to convergence and
    unpruned, are liblinear's squared-hinge SVMs (bias a feature of value 1) on the rows
    holding any of its labels."""
    rng = np.random.default_rng(2)
    X, Y = _random_csr(rng, 80, 30, 6), _labels(rng, 80, 5)
    ptr, idx, val = _unit_rows(X)
    sq = np.bincount(np.repeat(np.arange(80), np.diff(ptr)), weights=val * val, minlength=80)
    label_ptr, label_rows, _ = transpose(Y.indptr, Y.indices, np.ones(len(Y.indices)), 5)
    perm = np.arange(5, dtype=np.int64)
    got = kernels.train_node(
        ptr,
        idx,
        val,
        sq.astype(np.float32),
        label_ptr,
        label_rows,
        perm,
        np.arange(6),
        300,
        1.0,
        0.0,
        7,
        2,
        np.full(80, -1, np.int64),
        np.full(30, -1, np.int64),
    )
    w_ptr, w_feature, w_val, bias = got
    W = np.zeros((30, 5))
    for k in range(5):
        s = slice(w_ptr[k], w_ptr[k + 1])
        assert np.all(np.diff(w_feature[s]) > 0)  # features ascending, once
        W[w_feature[s], k] = w_val[s]
    A, T = _dense(CSR(ptr, idx, val, 30)), _dense(Y)
    node_rows = T.sum(axis=1) > 0
    for lab in range(5):
        svm = LinearSVC(C=1.0, loss="squared_hinge", dual=True, tol=1e-8, max_iter=100_000)
        svm.fit(A[node_rows], T[node_rows, lab] > 0)
        np.testing.assert_allclose(W[:, lab], svm.coef_[0], atol=2e-3)
        np.testing.assert_allclose(bias[lab], svm.intercept_[0], atol=2e-3)


def _reference_losses(
    tree: LabelTree, Q: CSR, ids: np.ndarray, n_features: int, leaf: bool = True
) -> np.ndarray:
    """The path losses from the tree's arrays, by dense products and explicit search
    (``leaf=False``: those above the leaves)."""
    q = _dense(CSR(*_unit_rows(Q), n_features))
    levels = [
        tree.bounds[tree.level_ptr[v] : tree.level_ptr[v + 1]]
        for v in range(len(tree.level_ptr) - 1)
    ]
    nodes, W = [], []
    for v, starts in enumerate(levels):
        for j in range(len(starts) - 1):
            n = len(nodes)
            nodes.append((v, j))
            dense = np.zeros((n_features, tree.child_ptr[n + 1] - tree.child_ptr[n]))
            for k, c in enumerate(range(tree.child_ptr[n], tree.child_ptr[n + 1])):
                s = slice(tree.w_ptr[c], tree.w_ptr[c + 1])
                dense[tree.w_feature[s], k] = tree.w_val[s]
            W.append(dense)
    position = {int(lab): p for p, lab in enumerate(tree.perm)}
    out = np.zeros(ids.shape)
    for i, row in enumerate(ids):
        for j, lab in enumerate(row):
            if lab < 0:
                continue
            if int(lab) not in position:
                out[i, j] = UNSEEN
                continue
            p, loss = position[int(lab)], 0.0
            for v, starts in enumerate(levels):
                local = max(k for k in range(len(starts) - 1) if starts[k] <= p)
                n = nodes.index((v, local))
                if v + 1 < len(levels):
                    below = list(levels[v + 1])
                    child = max(k for k in range(len(below) - 1) if below[k] <= p)
                    child -= below.index(starts[local])
                elif leaf:
                    child = p - starts[local]
                else:
                    continue
                margin = q[i] @ W[n][:, child] + tree.bias[tree.child_ptr[n] + child]
                loss += max(0.0, 1.0 - margin) ** 2
            out[i, j] = loss
    return out


def test_nodes_are_handed_out_costliest_first_in_batches_of_a_share_or_less():
    from dslide_dask.model.tree_nodes import BATCHES_PER_WORKER, cost_batches

    cost = list(np.random.default_rng(0).pareto(1.5, 300) + 0.01)
    batches = cost_batches(cost, 2)
    assert sorted(j for b in batches for j in b) == list(range(300))  # each job once
    order = [j for b in batches for j in b]
    assert [cost[j] for j in order] == sorted(cost, reverse=True)
    grain = sum(cost) / (2 * BATCHES_PER_WORKER)
    for batch in batches:  # a batch passes the grain by its last job alone, if at all
        assert len(batch) == 1 or sum(cost[j] for j in batch[:-1]) < grain
    assert cost_batches([], 2) == []


def test_path_losses_are_those_of_the_classifiers_on_each_labels_path(monkeypatch):
    monkeypatch.setattr(label_tree, "LEAF", 4)
    monkeypatch.setattr(label_tree, "SPAN", 2)  # 40 labels: depth 4, nodes at 0, 2 and 4
    rng = np.random.default_rng(3)
    X, Y = _random_csr(rng, 200, 50, 8), _labels(rng, 200, 40)
    Y = CSR(Y.indptr, Y.indices, None, 44)  # labels 40-43 have no training row
    assert set(Y.indices) == set(range(40))
    tree = _tree(X, Y)
    assert tree.n_labels == 40 and sorted(tree.perm) == list(range(40))
    assert len(tree.level_ptr) - 1 == 3
    assert len(tree.child_ptr) - 1 == 1 + 4 + 16
    Q = _random_csr(rng, 12, 60, 10)  # features the tree never saw count for nothing
    ids = rng.integers(-1, 44, (12, 9))
    got = tree.losses(_unit_rows(Q), ids)
    want = _reference_losses(tree, Q, ids, 60)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (got[ids < 0] == 0).all()
    assert (got[ids >= 40] == UNSEEN).all() and (ids >= 40).any()
    assert (got[(ids >= 0) & (ids < 40)] < 100).all()
    ptr, idx, val = _unit_rows(Q)  # features out of order within each row: the same
    flipped = np.concatenate(
        [np.arange(a, b)[::-1] for a, b in zip(ptr[:-1], ptr[1:], strict=True)]
    )
    again = tree.losses((ptr, idx[flipped], val[flipped]), ids)
    np.testing.assert_allclose(again, got, rtol=1e-5, atol=1e-6)


def test_a_damaged_tree_is_named(monkeypatch):
    monkeypatch.setattr(label_tree, "LEAF", 4)
    monkeypatch.setattr(label_tree, "SPAN", 2)
    rng = np.random.default_rng(4)
    X, Y = _random_csr(rng, 100, 30, 6), _labels(rng, 100, 20)
    state = _tree(X, Y).state()
    again = LabelTree.from_state(state, 20, 30)
    for name, array in state.items():
        np.testing.assert_array_equal(getattr(again, name), array)

    def damaged(name, change):
        arrays = {k: v.copy() for k, v in state.items()}
        arrays[name] = change(arrays[name])
        return arrays

    def unnested(bounds):  # level 1's middle moved: level 2 no longer splits it
        out = bounds.copy()
        out[state["level_ptr"][1] + 1] -= 1
        return out

    cases = [
        ("perm", lambda a: np.where(a == 0, 1, a), "perm must list distinct labels of the 20"),
        ("w_feature", lambda a: a + 30, r"w_feature must lie in \[0, 30\)"),
        ("w_feature", lambda a: a[::-1].copy(), "w_feature must rise within each classifier"),
        ("bounds", unnested, "must split level"),
        ("w_val", lambda a: a.astype(np.float64), "w_val must be 1-D float32"),
        ("bias", lambda a: np.full_like(a, np.nan), "w_val and bias must be finite"),
        ("child_ptr", lambda a: a[:-1], "child_ptr must have"),
        ("w_ptr", lambda a: a[:-1], "w_ptr must have an entry a child"),
        ("w_ptr", lambda a: np.minimum(a, a[len(a) // 2]), "w_ptr must run from 0"),
    ]
    for name, change, message in cases:
        with pytest.raises(ValueError, match=message):
            LabelTree.from_state(damaged(name, change), 20, 30)


def test_rescoring_multiplies_by_the_likelihood_and_reorders():
    ids = np.array([[4, 2, 9, -1]])
    scores = np.array([[0.5, 0.4, 0.3, -np.inf]], np.float32)
    losses = np.array([[2.0, 0.0, 0.5, 0.0]], np.float32)
    top, got = tree_rescored(ids, scores, losses, 1.0, 3)
    want = np.array([0.5 * np.exp(-2.0), 0.4, 0.3 * np.exp(-0.5)])
    assert list(top[0]) == [2, 9, 4]
    np.testing.assert_allclose(got[0], np.sort(want)[::-1], rtol=1e-6)


def test_the_trees_left_to_the_fit_follow_the_share_of_rare_labels():
    frequent = np.repeat(np.arange(10), 10)  # 10 labels of 10 training rows each
    assert trees_for(frequent, 10) == 1
    one_row = np.concatenate([frequent, np.arange(10, 60)])  # 50 of the 150 of single rows
    assert trees_for(one_row, 60) == 2
    assert trees_for(np.concatenate([frequent, np.repeat(np.arange(10, 27), 3)]), 27) == 2
    assert trees_for(np.concatenate([frequent, np.arange(10, 50)]), 50) == 1  # 40 of 140
    assert trees_for(np.zeros(0, np.int64), 5) == 1
    assert mostly_rare(one_row, 60) and not mostly_rare(frequent, 10)


def test_a_fit_ranks_by_its_trees_saves_them_and_names_a_damaged_one(small, tmp_path):  # noqa: F811
    train, test = small
    off = SlideClassifier(epochs=1, label_tree=0, client=False, **PARAMS).fit(train.X, train.Y)
    assert off.neighbours_.trees == ()
    auto = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    assert len(auto.neighbours_.trees) == trees_for(train.Y.indices, train.n_labels)
    clf = SlideClassifier(epochs=1, n_label_trees=2, client=False, **PARAMS)
    clf.fit(train.X, train.Y)
    trees = clf.neighbours_.trees
    seen = len(np.unique(train.Y.indices))  # a tree holds the labels with a training row
    assert len(trees) == 2 and all(tree.n_labels == seen for tree in trees)
    assert not np.array_equal(trees[0].perm, trees[1].perm)  # split from different seeds
    X = test.X.slice_rows(0, 100)
    weight, tail = clf._choose_weight()
    ids, logits = clf._network_topk(X, clf._candidates(), True)
    index = clf.neighbours_
    model = clf.fused_model()
    votes = model.with_centroid_votes(
        X, (ids, logits), model.votes(clf.trainer_, X, weight), weight, tail
    )
    from dslide_dask.model.fusion import fused_topk

    fused = fused_topk(ids, logits, votes, weight, RERANKED, tail, index.inverse_propensity)
    query = (X.indptr, X.indices, normalised(X.indptr, X.values()))
    mean = (trees[0].losses(query, fused[0]) + trees[1].losses(query, fused[0])) / 2
    np.testing.assert_allclose(index.tree_losses(X, fused[0]), mean, rtol=1e-6)
    want = tree_rescored(*fused, mean, 0.5, 5)
    got = clf.predict_topk(X, 5, return_scores=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    url = clf.save(str(tmp_path / "model"))
    loaded = SlideClassifier.load(url)
    assert loaded.n_label_trees == 2 and len(loaded.neighbours_.trees) == 2
    for tree, again in zip(trees, loaded.neighbours_.trees, strict=True):
        for name, array in tree.state().items():
            np.testing.assert_array_equal(again.state()[name], array)
    again = loaded.predict_topk(X, 5, return_scores=True)
    np.testing.assert_array_equal(again[0], got[0])
    manifest = next((tmp_path / "model").rglob("neighbours/index.json"))
    entries = json.loads(manifest.read_text())
    for gone, error in (
        ({"tree2_bias"}, "index.json: neighbour index: label tree arrays"),
        ({k for k in entries["arrays"] if k.startswith("tree_")}, "label tree 1 is missing"),
    ):
        arrays = {k: v for k, v in entries["arrays"].items() if k not in gone}
        manifest.write_text(json.dumps({**entries, "arrays": arrays}))
        with pytest.raises(CheckpointError, match=error):
            SlideClassifier.load(url)
    for bad, error in (
        ({"label_tree": 3.0}, r"label_tree must be a number in \[0.0, 2.0\]"),
        ({"n_label_trees": 0}, r"n_label_trees must be an integer in \[1, 8\]"),
    ):
        with pytest.raises(ValueError, match=error):
            SlideClassifier(epochs=1, client=False, **bad, **PARAMS).fit(train.X, train.Y)

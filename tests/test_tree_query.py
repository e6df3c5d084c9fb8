"""A served row's label trees: the losses of the candidates that can be among its best,
and the same best candidates and scores as when every candidate's loss is computed."""

import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import tree_inner, tree_query
from dslide_dask.kernels.neighbours import transpose
from dslide_dask.kernels.shared_dots import shared_dots
from dslide_dask.model import label_tree, tree_serving
from dslide_dask.model.fusion import tree_rescored
from dslide_dask.model.tree_serving import forest_topk_losses
from tests.test_label_centroids import _labels
from tests.test_label_tree import _tree, _unit_rows
from tests.test_neighbours import _dense, _random_csr


@pytest.mark.parametrize("n_trees", [1, 2])
@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("shared_rows", [3, 1 << 30])
@pytest.mark.parametrize("block", [1024, 7])
@pytest.mark.parametrize("hot", [0, 12])
def test_bounded_losses_keep_the_best_k_of_every_candidate_scored(
    monkeypatch, n_trees, k, shared_rows, block, hot
):
    monkeypatch.setattr(tree_inner, "HOT_LEAVES", hot)  # 12 of 40 leaves scored by feature
    monkeypatch.setattr(label_tree, "LEAF", 4)
    monkeypatch.setattr(label_tree, "SPAN", 2)  # 40 labels: classifiers at 3 levels
    monkeypatch.setattr(tree_query, "SHARED_ROWS", shared_rows)  # 1 << 30: none shared
    monkeypatch.setattr(tree_serving, "BLOCK_ROWS", block)  # 7: the rows in 6 calls
    rng = np.random.default_rng(7)
    X, Y = _random_csr(rng, 300, 50, 8), _labels(rng, 300, 40)
    Y = CSR(Y.indptr, Y.indices, None, 44)  # labels 40-43: not in the trees
    trees = [_tree(X, Y, seed) for seed in range(n_trees)]
    query = _unit_rows(_random_csr(rng, 40, 50, 10))
    ids = rng.integers(-1, 44, (40, 30))
    scores = rng.random((40, 30)).astype(np.float32)
    scores[:, :3] -= 0.5  # a few negative scores: their bound is 0, not the score's
    got = forest_topk_losses(trees, query, ids, scores, 1.0, k)
    full = sum(tree.losses(query, ids) for tree in trees) / np.float32(n_trees)
    done = np.isfinite(got)
    assert (~done).any()  # some candidates had no chance: their leaves were not scored
    want = tree_rescored(ids, scores, full, 1.0, k)
    served = tree_rescored(ids, scores, got, 1.0, k)
    np.testing.assert_array_equal(served[0], want[0])
    if shared_rows > len(ids) and not hot:  # every leaf gathered, as path_losses does
        np.testing.assert_array_equal(got[done], full[done])
        np.testing.assert_array_equal(served[1], want[1])
    else:  # a shared or hot leaf's margin is summed in the row's order: rounding apart
        np.testing.assert_allclose(got[done], full[done], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(served[1], want[1], rtol=1e-6)


def test_shared_dots_are_the_dot_products_of_the_labels_worth_spreading():
    rng = np.random.default_rng(11)
    Q = _random_csr(rng, 30, 200, 6)
    V = _random_csr(rng, 12, 200, 150)  # 12 labels, long vectors
    short = np.diff(V.indptr).argmin()
    rows = rng.integers(0, 30, 400)
    labels = rng.integers(0, 12, 400)
    labels[labels == 5] = 4  # label 5 named by no pair
    labels[:1] = 11
    labels[1:][labels[1:] == 11] = 10  # label 11 by one pair: below min_rows
    got = shared_dots(Q.indptr, Q.indices, Q.values(), rows, labels, V.indptr, V.indices,
                      V.values(), 200, 2, 3)  # fmt: skip
    want = (_dense(Q) @ _dense(V).T)[rows, labels]
    assert np.isnan(got[labels == 11]).all()
    spread = np.isfinite(got)
    assert spread[(labels != 11) & (labels != short)].all()
    np.testing.assert_allclose(got[spread], want[spread], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share", [1 / 8, 0.9, 2.0])
def test_dense_rows_of_frequent_features_give_the_losses_of_the_entries_to_the_bit(
    monkeypatch, share
):
    monkeypatch.setattr(label_tree, "LEAF", 4)
    monkeypatch.setattr(label_tree, "SPAN", 2)
    monkeypatch.setattr(tree_inner, "DENSE_SHARE", share)
    rng = np.random.default_rng(3)
    X, Y = _random_csr(rng, 300, 50, 8), _labels(rng, 300, 40)
    trees = [_tree(X, Y, seed) for seed in range(2)]
    query = _unit_rows(_random_csr(rng, 40, 50, 10))
    ids = rng.integers(-1, 40, (40, 30))
    scores = rng.random((40, 30)).astype(np.float32)
    for tree in trees:
        paths, f_ptr, f_child, f_val, n_inner, slot, dense = tree.served
        if share == 0.9:  # both kinds of feature (1 / 8: all dense here; 2: none)
            assert 0 < dense.shape[0] < len(slot) and len(f_child) > 0
        sparse = _by_feature(tree)
        ptr, idx, val = query
        none = np.full(len(slot), -1, np.int32), np.zeros((0, n_inner), np.float32)
        args = (ptr, idx, val, ids, tree.position, paths, tree.w_ptr, tree.w_feature,
                tree.w_val, tree.bias)  # fmt: skip
        want = tree_query.path_losses(*args, *sparse, n_inner, *none, tree.n_features, 3)
        np.testing.assert_array_equal(tree.losses(query, ids), want)
    got = forest_topk_losses(trees, query, ids, scores, 1.0, 5)
    served = [tree.served for tree in trees]
    by_tree = [tuple(t.position for t in trees), tuple(s[0] for s in served),
               tuple(t.w_ptr for t in trees), tuple(t.w_feature for t in trees),
               tuple(t.w_val for t in trees), tuple(t.bias for t in trees)]  # fmt: skip
    full = [_by_feature(tree) for tree in trees]
    monkeypatch.setattr(tree_inner, "DENSE_SHARE", 2.0)  # the hot leaves' entries sparse too
    sparse_hot = tuple(
        tree_inner.hot_leaves(t.w_ptr, t.w_feature, t.w_val, t.bias, s[4], t.n_features)
        for t, s in zip(trees, served, strict=True)
    )
    no_slot = tuple(np.full(len(f[0]) - 1, -1, np.int32) for f in full)
    no_dense = tuple(np.zeros((0, s[4]), np.float32) for s in served)
    old_call = tree_query.bounded_losses(  # without the dense rows: every entry sparse
        *query, ids, scores, 1.0, 5, *by_tree, *(tuple(f[a] for f in full) for a in range(3)),
        tuple(s[4] for s in served), max(t.n_features for t in trees), 3,
        tree_query.SHARED_ROWS, no_slot, no_dense, tuple(zip(*sparse_hot, strict=True)),
    )  # fmt: skip
    np.testing.assert_array_equal(got, old_call)


def _by_feature(tree: label_tree.LabelTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The classifiers above the leaves by feature, every feature's entries sparse."""
    n_inner = tree.served[4]
    end = tree.w_ptr[n_inner]
    return transpose(tree.w_ptr[: n_inner + 1], tree.w_feature[:end], tree.w_val[:end],
                     tree.n_features)  # fmt: skip

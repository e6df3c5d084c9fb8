"""A label tree's own search: each row's best leaf nodes, and an index's labels of least
path loss among theirs, against the tree's arrays and a scan of every label."""

import numpy as np

from dslide_dask import SlideClassifier
from dslide_dask.model import label_tree
from tests.test_label_centroids import _labels, small  # noqa: F401 (a fixture)
from tests.test_label_tree import _reference_losses, _tree, _unit_rows
from tests.test_neighbours import PARAMS, _random_csr


def test_the_trees_own_search_finds_the_labels_of_its_best_leaf_nodes(monkeypatch):
    monkeypatch.setattr(label_tree, "LEAF", 4)
    monkeypatch.setattr(label_tree, "SPAN", 2)  # 40 labels: depth 4, nodes at 0, 2 and 4
    rng = np.random.default_rng(5)
    X, Y = _random_csr(rng, 200, 50, 8), _labels(rng, 200, 40)
    tree = _tree(X, Y)
    Q = _random_csr(rng, 12, 50, 10)
    paths, starts = tree.leaf_nodes
    n_nodes = len(starts) - 1
    assert n_nodes == 16 and paths.shape == (16, 2)
    every = tree.searched(_unit_rows(Q), n_nodes)  # every leaf node: every label, once
    for row in every:
        assert sorted(row[row >= 0]) == sorted(tree.perm)
    labels = np.broadcast_to(tree.perm, (12, 40))
    above = _reference_losses(tree, Q, labels, 50, leaf=False)  # a label's: its node's
    node_of = np.searchsorted(starts, np.arange(40), side="right") - 1  # of each position
    for beam in (1, 3):
        got = tree.searched(_unit_rows(Q), beam)
        assert got.shape == (12, beam * int(np.diff(starts).max()))
        for i in range(12):
            node_loss = np.full(n_nodes, np.inf)
            node_loss[node_of] = above[i]
            best = np.argsort(node_loss, kind="stable")[:beam]
            want = tree.perm[np.isin(node_of, best)]
            assert sorted(got[i][got[i] >= 0]) == sorted(want)


def test_an_index_searched_through_every_leaf_node_ranks_as_a_full_scan(small):  # noqa: F811
    train, test = small
    clf = SlideClassifier(epochs=1, n_label_trees=2, client=False, **PARAMS)
    index = clf.fit(train.X, train.Y).neighbours_
    X = test.X.slice_rows(0, 50)
    every = max(len(tree.leaf_nodes[1]) - 1 for tree in index.trees)
    ids, losses = index.tree_search(X, every, 10)
    seen = np.unique(train.Y.indices)
    full = index.tree_losses(X, np.broadcast_to(seen, (50, len(seen))).copy())
    np.testing.assert_allclose(losses, np.sort(full, axis=1)[:, :10], rtol=1e-6)
    np.testing.assert_allclose(index.tree_losses(X, ids), losses, rtol=1e-6)
    assert (np.diff(losses, axis=1) >= 0).all() and (ids >= 0).all()
    assert every > 1
    few, few_losses = index.tree_search(X, 1, 10)  # one node a tree: a subset, still ranked
    assert (np.diff(few_losses, axis=1) >= 0).all() and (few_losses >= losses).all()
    assert not np.array_equal(few, ids)

"""A served row's label trees: the losses of the candidates that can be among its best,
and the same best candidates and scores as when every candidate's loss is computed."""

import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.model import label_tree
from dslide_dask.model.fusion import tree_rescored
from dslide_dask.model.label_tree import forest_topk_losses
from tests.test_label_centroids import _labels
from tests.test_label_tree import _tree, _unit_rows
from tests.test_neighbours import _random_csr


@pytest.mark.parametrize("n_trees", [1, 2])
@pytest.mark.parametrize("k", [1, 5])
def test_bounded_losses_keep_the_best_k_of_every_candidate_scored(monkeypatch, n_trees, k):
    monkeypatch.setattr(label_tree, "LEAF", 4)
    monkeypatch.setattr(label_tree, "SPAN", 2)  # 40 labels: classifiers at 3 levels
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
    np.testing.assert_array_equal(got[done], full[done])
    want = tree_rescored(ids, scores, full, 1.0, k)
    served = tree_rescored(ids, scores, got, 1.0, k)
    np.testing.assert_array_equal(served[0], want[0])
    np.testing.assert_array_equal(served[1], want[1])

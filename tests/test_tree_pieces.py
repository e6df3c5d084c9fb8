"""Label trees in pieces: partial trees add up to the whole tree's losses, saved pieces join
into the whole tree's arrays or load as a worker's share, and pieces that do not fit are
refused naming what is wrong."""

import numpy as np
import pytest

from dslide_dask.checkpoint import CheckpointError
from dslide_dask.checkpoint.neighbours import load_tree_pieces, save_neighbours, tree_pieces
from dslide_dask.checkpoint.tree_pieces import joined_trees, partial_tree, save_tree_piece
from dslide_dask.model.fusion import tree_rescored
from dslide_dask.model.neighbours import NeighbourIndex
from dslide_dask.model.tree_serving import forest_topk_losses
from dslide_dask.model.tree_shards import (
    SEGMENT,
    KeptNodes,
    forest_losses,
    inner_losses,
    leaf_losses,
    node_part,
    rounds_topk_losses,
    segment,
    summed_losses,
    unit_query,
)
from tests.test_label_centroids import small  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def tree_and_pieces(small):  # noqa: F811
    train, test = small
    index = NeighbourIndex.build(train.X, train.Y).with_built_trees(3)
    tree = index.trees[0]
    n_nodes = len(tree.child_ptr) - 1
    owner = np.random.default_rng(0).integers(0, 3, n_nodes)  # nodes dealt to 3 pieces
    pieces = []
    for p in range(3):
        nodes = np.flatnonzero(owner == p)
        kept = KeptNodes.empty()
        seg = segment(tree, nodes)
        joined = tuple(seg[name] for name in SEGMENT[1:])
        parts = [node_part(joined, j) for j in range(len(nodes))]
        kept.keep(0, list(nodes), parts)
        pieces.append((kept.partial(0, tree), nodes))
    return index, tree, pieces, test


def test_the_pieces_losses_add_up_to_the_whole_trees(tree_and_pieces):
    index, tree, pieces, test = tree_and_pieces
    ids = np.random.default_rng(1).integers(-1, index.n_labels, (test.n_points, 30))
    unseen = np.setdiff1d(np.arange(index.n_labels), tree.perm)
    if len(unseen):
        ids[:, 0] = unseen[0]  # a label without a training row
    whole = forest_losses((tree,), test.X, ids)
    parts = [forest_losses((piece,), test.X, ids) for piece, _ in pieces]
    assert all((p <= whole + 1e-4).all() for p in parts)  # each holds a share of the path
    np.testing.assert_allclose(summed_losses(parts), whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 5, 50])
def test_pieces_asked_in_rounds_rank_as_the_whole_tree(tree_and_pieces, k):
    index, tree, pieces, test = tree_and_pieces
    rng = np.random.default_rng(3)
    ids = rng.integers(-1, index.n_labels, (test.n_points, 40))
    scores = rng.random(ids.shape).astype(np.float32)
    trees = [(piece,) for piece, _ in pieces]
    inner = summed_losses([inner_losses(t, test.X, ids) for t in trees])
    asked = []

    def leaves(chosen):
        asked.append(int(chosen.sum()))
        return np.sum([leaf_losses(t, test.X, ids, chosen) for t in trees], axis=0)

    got = rounds_topk_losses(inner, leaves, ids, scores, 0.5, k)
    whole = forest_topk_losses((tree,), unit_query(test.X), ids, scores, 0.5, k)
    exact = forest_losses((tree,), test.X, ids)
    scored = np.isfinite(got)
    np.testing.assert_allclose(got[scored], exact[scored], rtol=1e-5, atol=1e-6)
    assert (scored | ~np.isfinite(whole)).all()  # at least the leaves the whole tree scored
    if k < 40:
        assert sum(asked) < (ids >= 0).sum()  # and not every leaf
    here, _ = tree_rescored(ids, scores, got, 0.5, k)
    there, _ = tree_rescored(ids, scores, whole, 0.5, k)
    np.testing.assert_array_equal(here, there)


def test_saved_pieces_join_into_the_whole_tree_or_load_as_a_share(tree_and_pieces, tmp_path):
    index, tree, pieces, test = tree_and_pieces
    url = str(tmp_path)
    entries: dict = {}
    for p, (piece, nodes) in enumerate(pieces):
        entries.update(save_tree_piece(url, (piece,), (nodes,), p))
    save_neighbours(url, index.with_trees(()), None, entries)
    assert tree_pieces(url) == 3
    arrays = {n: np.load(tmp_path / "neighbours" / f"{n}.npy") for n in entries}
    whole = joined_trees(dict(arrays))
    for name, array in tree.state().items():
        np.testing.assert_array_equal(whole[f"tree_{name}"], array, err_msg=name)
    share, nodes = load_tree_pieces(url, [0, 2])
    np.testing.assert_array_equal(nodes[0], np.sort(np.concatenate([pieces[0][1], pieces[2][1]])))
    ids = np.random.default_rng(2).integers(0, index.n_labels, (test.n_points, 10))
    rest = forest_losses((pieces[1][0],), test.X, ids)
    np.testing.assert_allclose(
        summed_losses([forest_losses(share, test.X, ids), rest]),
        forest_losses((tree,), test.X, ids),
        rtol=1e-5,
        atol=1e-6,
    )


def test_pieces_that_do_not_fit_are_refused_naming_the_node(tree_and_pieces, tmp_path):
    index, tree, pieces, _ = tree_and_pieces
    arrays = {f"tree_{k}": getattr(tree, k) for k in ("perm", "bounds", "level_ptr", "child_ptr")}
    for p, (piece, nodes) in enumerate(pieces[:2]):  # the third piece lost
        arrays.update({f"tree_p{p}_{k}": v for k, v in segment(piece, nodes).items()})
    missing = int(np.min(pieces[2][1]))
    with pytest.raises(ValueError, match=f"node {missing} is in no piece"):
        joined_trees(dict(arrays))
    state, held = partial_tree(dict(arrays), "tree")  # a share: the rest weightless
    assert len(held) == len(pieces[0][1]) + len(pieces[1][1])
    twice = dict(arrays)
    twice.update({f"tree_p2_{k}": v for k, v in segment(pieces[0][0], pieces[0][1]).items()})
    with pytest.raises(ValueError, match="a node is in two pieces"):
        joined_trees(twice)
    url = str(tmp_path)
    entries: dict = {}
    for p, (piece, nodes) in enumerate(pieces[:2]):
        entries.update(save_tree_piece(url, (piece,), (nodes,), p))
    save_neighbours(url, index.with_trees(()), None, entries)
    from dslide_dask.checkpoint.neighbours import load_neighbours

    with pytest.raises(
        CheckpointError, match=f"index.json: label tree 1: node {missing} is in no piece"
    ):
        load_neighbours(url)

"""Shard layouts: every neuron has exactly one owner, and the maps invert."""

import numpy as np
import pytest

from dslide_dask.model.init import init_rows
from dslide_dask.model.layout import ShardLayout


@pytest.mark.parametrize(
    "layout",
    [
        ShardLayout.strided(103, 1),
        ShardLayout.strided(103, 4),
        ShardLayout.from_capacities(103, (2, 1)),
        ShardLayout.from_capacities(1000, (4, 1, 2)),
    ],
)
def test_layout_is_a_bijection(layout):
    ids = np.arange(layout.n_neurons)
    owner, local = layout.owner(ids), layout.to_local(ids)
    sizes = [layout.size(s) for s in range(layout.n_shards)]
    assert sum(sizes) == layout.n_neurons
    for s in range(layout.n_shards):
        mine = ids[owner == s]
        assert len(mine) == sizes[s]
        np.testing.assert_array_equal(np.sort(local[owner == s]), np.arange(sizes[s]))
        np.testing.assert_array_equal(layout.global_ids(s, local[owner == s]), mine)


def test_capacities_set_the_share():
    layout = ShardLayout.from_capacities(3000, (2, 1))
    assert layout.pattern == (0, 1, 0)
    assert [layout.size(s) for s in range(2)] == [2000, 1000]
    assert ShardLayout.strided(10, 3).pattern == (0, 1, 2)


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="capacities must be positive"):
        ShardLayout.from_capacities(10, (1, 0))
    with pytest.raises(ValueError, match="must use every shard"):
        ShardLayout(10, (0, 2))
    with pytest.raises(ValueError, match=r"n_neurons \(2\) must be >= the pattern length \(3\)"):
        ShardLayout.strided(2, 3)


@pytest.mark.parametrize(
    ("old", "capacities", "new_index", "takers"),
    [
        (ShardLayout.from_capacities(670_091, (17, 20)), (17, 20, 20, 20), (0, 1), {2, 3}),
        (ShardLayout.from_capacities(5_000, (85, 100, 100)), (85, 100), (0, None, 1), None),
        (ShardLayout.strided(1_000, 2), (1, 1), (1, 0), None),  # shards swap indices
    ],
    ids=["2 workers join 2", "the middle one of 3 leaves", "renumbered only"],
)
def test_a_rebalanced_layout_moves_only_the_rows_a_share_asks_for(
    old, capacities, new_index, takers
):
    new = old.rebalanced(capacities, new_index)
    ids = np.arange(old.n_neurons)
    test_layout_is_a_bijection(new)
    shares = np.array([new.size(s) for s in range(new.n_shards)]) / new.n_neurons
    np.testing.assert_allclose(shares, np.array(capacities) / sum(capacities), atol=0.01)
    renamed = np.array([-1 if s is None else s for s in new_index])[old.owner(ids)]
    moved = renamed != new.owner(ids)
    # the least any layout with these shares could move: what the shards over their
    # share (or going away) must give up
    kept = [(renamed == s).sum() for s in range(new.n_shards)]
    least = sum(max(0, k - new.size(s)) for s, k in enumerate(kept)) + (renamed < 0).sum()
    assert moved.sum() == least
    if takers is not None:
        assert set(new.owner(ids[moved]).tolist()) == takers
    for s in range(new.n_shards):  # each shard finds its rows where they were
        for j, here, there in new.sources(s, old):
            mine = new.global_ids(s, here)
            np.testing.assert_array_equal(old.global_ids(j, there), mine)
            assert (old.owner(mine) == j).all()


@pytest.mark.parametrize(
    "layout", [ShardLayout.strided(70_000, 3), ShardLayout.from_capacities(70_000, (2, 1))]
)
def test_initial_rows_are_the_same_whatever_the_sharding(layout):
    """A shard's initial rows are the whole layer's rows it owns (a block of rows drawn
    straight into place, or gathered from its stream, gives the same values)."""
    whole = init_rows(5, np.arange(layout.n_neurons), 8, 0.1)
    assert abs(float(whole.std()) - 0.1) < 0.002
    for s in range(layout.n_shards):
        mine = layout.global_ids(s, np.arange(layout.size(s)))
        np.testing.assert_array_equal(init_rows(5, mine, 8, 0.1), whole[mine])
    some = np.array([69_999, 3, 65_536, 4])  # out of order, across blocks
    np.testing.assert_array_equal(init_rows(5, some, 8, 0.1), whole[some])

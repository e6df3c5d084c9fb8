"""Shard layouts: every neuron has exactly one owner, and the maps invert."""

import numpy as np
import pytest

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

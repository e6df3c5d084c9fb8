"""A live re-balance's arithmetic, in one process: each new shard gets every one of its
rows (weights, both Adam moments, update counts) from the old shards that held them,
bit for bit, and the same hash tables a restore of those rows would build."""

import numpy as np
import pytest

from dslide_dask.distributed.moves.handover import rows_for, take_rows
from dslide_dask.distributed.registry import register
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.wide_shard import WideShard

N_LABELS = 3_001


class _Part:
    """What the registry holds for a shard: an object with a ``shard``."""

    def __init__(self, shard: WideShard) -> None:
        self.shard = shard


def _by_neuron(shards: list[WideShard]) -> dict[str, np.ndarray]:
    out = {}
    for shard in shards:
        rows = shard.global_ids(np.arange(shard.n_local))
        for name, a in shard.state()[0].items():
            if name not in out:
                out[name] = np.zeros((N_LABELS, *a.shape[1:]), a.dtype)
            out[name][rows] = a
    return out


@pytest.mark.parametrize(
    ("beta1", "moments"), [(0.0, "float32"), (0.9, "float32"), (0.9, "bfloat16")]
)
def test_every_row_arrives_where_the_new_layout_puts_it(beta1, moments):
    cfg = SlideConfig(hidden=(16,), K=2, L=4, beta1=beta1, moment_dtype=moments)
    old = ShardLayout.from_capacities(N_LABELS, (17, 20))
    shards = [WideShard(cfg, 16, old, s) for s in range(old.n_shards)]
    rng = np.random.default_rng(0)
    for shard in shards:  # a trained shard's state: every array non-trivial
        shard.W_v[...] = rng.integers(1, 1000, shard.W_v.shape).astype(shard.W_v.dtype)
        shard.W_n[...] = rng.integers(1, 50, shard.n_local)
        shard.bias[...] = rng.standard_normal(shard.n_local)
        if beta1 > 0:
            shard.W_m[...] = rng.integers(1, 1000, shard.W_m.shape).astype(shard.W_m.dtype)
        shard.step = 40
    parts = [_Part(shard) for shard in shards]  # the registry holds them weakly
    for s, part in enumerate(parts):
        register("old-model", s, part)
    new = old.rebalanced((17, 20, 20), (0, 1))
    moved = []
    for s in range(new.n_shards):
        shard = WideShard(cfg, 16, new, s, initialize=False)
        donors = [j for j, _, _ in new.sources(s, old)]
        pieces = {j: rows_for("old-model", j, new, s) for j in donors}
        assert all(("W.m" in p.arrays) == (beta1 > 0) for p in pieces.values())  # zeros stay
        take_rows(shard, old, pieces)
        moved.append(shard)
    want, got = _by_neuron(shards), _by_neuron(moved)
    for name in WideShard.ROW_ARRAYS:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for shard in moved:  # tables as a restore of the same rows builds them
        restored = WideShard(cfg, 16, new, shard.shard_index, initialize=False)
        restored.set_state(*shard.state())
        assert shard.step == 40
        np.testing.assert_array_equal(shard.index.counts, restored.index.counts)
        np.testing.assert_array_equal(shard.index.ids, restored.index.ids)


def test_rows_from_the_wrong_shards_are_refused():
    cfg = SlideConfig(hidden=(16,), K=2, L=4)
    old = ShardLayout.strided(100, 2)
    shard = WideShard(cfg, 16, old, 0)
    part = _Part(shard)
    register("model-b", 0, part)
    new = old.rebalanced((1, 1, 1), (0, 1))
    target = WideShard(cfg, 16, new, 2, initialize=False)
    with pytest.raises(ValueError, match=r"rows from shards \[0\], expected \[0, 1\]"):
        take_rows(target, old, {0: rows_for("model-b", 0, new, 2)})


@pytest.mark.parametrize("redrawn", [False, True], ids=["same hash functions", "redrawn"])
def test_a_prepared_shard_takes_the_rows_as_they_are_at_the_switch(redrawn):
    """A move prepared while training goes on: the new shard is built (and hashed) from a
    first copy; at the switch it takes the rows again as they are then, bit for bit, and
    keeps its tables, unless the old shards drew new hash functions meanwhile."""
    cfg = SlideConfig(hidden=(16,), K=2, L=4)
    old = ShardLayout.strided(N_LABELS, 2)
    shards = [WideShard(cfg, 16, old, s) for s in range(2)]
    parts = [_Part(shard) for shard in shards]
    for s, part in enumerate(parts):
        register("training-model", s, part)
    new = old.rebalanced((1, 1, 1), (0, 1))
    prepared = []
    for s in range(new.n_shards):
        shard = WideShard(cfg, 16, new, s, initialize=False)
        donors = [j for j, _, _ in new.sources(s, old)]
        take_rows(shard, old, {j: rows_for("training-model", j, new, s) for j in donors})
        prepared.append((shard, shard.index.ids.copy(), shard.index.counts.copy()))
    rng = np.random.default_rng(1)
    for shard in shards:  # the old model trains on: every array it keeps changes
        arrays = shard.state()[0]
        for name in shard.kept_arrays():
            arrays[name][...] = rng.integers(1, 100, arrays[name].shape)
        shard.step, shard.schedule.next_rebuild = 57, 100
        if redrawn:
            shard.index.draw(shard.seed + 1)
            shard.index.n_draws = 2
    for shard, ids, counts in prepared:
        donors = [j for j, _, _ in new.sources(shard.shard_index, old)]
        pieces = {j: rows_for("training-model", j, new, shard.shard_index) for j in donors}
        take_rows(shard, old, pieces, rehash=False)
        assert shard.step == 57 and shard.schedule.next_rebuild == 100
        assert shard.index.n_draws == (2 if redrawn else 1)
        kept = np.array_equal(shard.index.counts, counts) and np.array_equal(shard.index.ids, ids)
        assert kept != redrawn
    want, got = _by_neuron(shards), _by_neuron([shard for shard, _, _ in prepared])
    for name in shards[0].kept_arrays():
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)

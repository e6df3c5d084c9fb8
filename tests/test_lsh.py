"""Hash families, tables and active sets."""

import numpy as np
import pytest

from dslide_dask.kernels import active_sets as act
from dslide_dask.kernels import tables
from dslide_dask.model import SlideConfig
from dslide_dask.model.lsh_index import LSHIndex, RebuildSchedule


def pairs_at_angle(rng, n, dim, angle):
    """n random unit-vector pairs (u, v) with angle(u, v) == angle."""
    u = rng.standard_normal((n, dim))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    w = rng.standard_normal((n, dim))
    w -= (w * u).sum(1, keepdims=True) * u
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    v = np.cos(angle) * u + np.sin(angle) * w
    return u.astype(np.float32), v.astype(np.float32)


@pytest.mark.parametrize("angle", [0.2, 0.6, 1.0, 1.5, 2.2, 2.8])
def test_simhash_collision_rate_is_one_minus_angle_over_pi(angle):
    rng = np.random.default_rng(0)
    cfg = SlideConfig(hash_family="simhash", K=1, L=1024, range_pow=1, hidden=(128,))
    index = LSHIndex(128, cfg, seed=1, n_items=1)
    u, v = pairs_at_angle(rng, 200, 128, angle)
    rate = (index.buckets(u) == index.buckets(v)).mean()
    assert rate == pytest.approx(1 - angle / np.pi, abs=0.03)


def test_dwta_collides_more_for_closer_vectors():
    rng = np.random.default_rng(1)
    cfg = SlideConfig(hash_family="dwta", K=1, L=512, range_pow=3, hidden=(64,))
    index = LSHIndex(64, cfg, seed=2, n_items=1)
    rates = []
    for angle in (0.1, 0.5, 1.0, 1.5):
        u, v = pairs_at_angle(rng, 200, 64, angle)
        rates.append((index.buckets(np.abs(u)) == index.buckets(np.abs(v))).mean())
    assert all(a > b for a, b in zip(rates, rates[1:], strict=False)), rates
    assert rates[0] > 0.8


def test_dwta_densifies_zero_bins():
    """A vector that is zero in most dimensions still gets full, repeatable codes."""
    cfg = SlideConfig(hash_family="dwta", K=4, L=16, range_pow=12, hidden=(64,))
    index = LSHIndex(64, cfg, seed=3, n_items=1)
    x = np.zeros((2, 64), np.float32)
    x[:, 5] = 1.0
    x[:, 40] = 2.0
    b = index.buckets(x)
    assert (b[0] == b[1]).all()
    assert len(np.unique(b[0])) > 1  # different tables, different buckets


def fill(policy, offered, capacity=4):
    ids = np.zeros((1, 1, capacity), np.int32)
    counts = np.zeros((1, 1), np.int32)
    items = np.arange(offered, dtype=np.int32)
    tables.insert(ids, counts, np.zeros((offered, 1), np.int32), items, policy, 7)
    return ids[0, 0], counts[0, 0]


def test_fifo_bucket_keeps_the_newest():
    ids, count = fill(tables.FIFO, 10)
    assert count == 10
    assert sorted(ids) == [6, 7, 8, 9]


def test_reservoir_bucket_is_a_uniform_sample():
    kept = np.zeros(40)
    for seed in range(400):
        ids = np.zeros((1, 1, 4), np.int32)
        counts = np.zeros((1, 1), np.int32)
        tables.insert(
            ids,
            counts,
            np.zeros((40, 1), np.int32),
            np.arange(40, dtype=np.int32),
            tables.RESERVOIR,
            seed,
        )
        kept[ids[0, 0]] += 1
    # each of 40 items is kept with probability 4/40: 40 expected times in 400 runs
    assert kept.min() > 15 and kept.max() < 70, kept


def active_for(strategy, threshold=1, min_active=0, max_active=50):
    """Two tables, one example: bucket contents chosen by hand."""
    table_ids = np.zeros((2, 1, 4), np.int32)
    table_ids[0, 0] = [1, 2, 3, 4]
    table_ids[1, 0] = [3, 4, 5, 6]
    counts = np.full((2, 1), 4, np.int32)
    buckets = np.zeros((1, 2), np.int32)
    label_ptr = np.array([0, 1])
    labels = np.array([9], np.int32)
    scratch, marks = act.scratch(1, 20)
    active, n_active, n_label, _ = act.active_sets(
        buckets,
        table_ids,
        counts,
        label_ptr,
        labels,
        20,
        strategy,
        threshold,
        min_active,
        max_active,
        0,
        scratch,
        marks,
        np.zeros(0, np.int32),  # no shared neurons
        np.zeros((1, 0), np.uint8),
    )
    assert not scratch.any() and not marks.any(), "scratch must be left zeroed"
    return list(active[0, : n_active[0]]), int(n_label[0])


def test_active_set_union_puts_labels_first():
    got, n_label = active_for(act.UNION)
    assert n_label == 1 and got[0] == 9
    assert sorted(got[1:]) == [1, 2, 3, 4, 5, 6]


def test_active_set_threshold_and_topk_prefer_frequent_neurons():
    got, _ = active_for(act.THRESHOLD, threshold=2)
    assert sorted(got) == [3, 4, 9]
    got, _ = active_for(act.TOPK, max_active=3)
    assert sorted(got) == [3, 4, 9]


def test_active_set_padding_reaches_the_minimum_without_duplicates():
    got, _ = active_for(act.UNION, min_active=15)
    assert len(got) == 15 and len(set(got)) == 15


def test_rebuild_schedule_fixed_and_growing():
    fixed = RebuildSchedule(every=10)
    never = RebuildSchedule(every=0, redraw_every=5)  # training without tables
    assert not any(any(never.due(s)) for s in range(1, 50))
    assert [s for s in range(1, 41) if fixed.due(s)[0]] == [10, 20, 30, 40]
    growing = RebuildSchedule(every=10, growth=0.5)
    steps = [s for s in range(1, 200) if growing.due(s)[0]]
    gaps = np.diff(steps)
    assert steps[0] == 10 and (np.diff(gaps) > 0).all()
    redraw = RebuildSchedule(every=10, redraw_every=25)
    due = [redraw.due(s) for s in range(1, 51)]
    assert [s for s, (_, r) in enumerate(due, 1) if r] == [25, 50]


def _small_layer(rebuild_every: int):
    """A 300-neuron layer's config, and 16 hidden vectors with one label each."""
    from dslide_dask.data.csr import CSR

    cfg = SlideConfig(
        hidden=(8,), K=2, L=4, rebuild_every=rebuild_every, min_active=20, negatives="example"
    ).for_data(300)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((16, 8)).astype(np.float32)
    return cfg, h, CSR.from_lists([[int(i)] for i in rng.integers(0, 300, 16)], 300)


def test_a_fresh_layer_trains_on_padding_until_its_first_rebuild():
    """Tables of random rows would retrieve random neurons: a fresh shard's stay empty
    until the schedule's first rebuild, while anything else reading them builds them."""
    from dslide_dask.model.layout import ShardLayout
    from dslide_dask.model.wide_shard import WideShard

    cfg, h, Y = _small_layer(3)

    def found(shard):  # labels or retrieved, per example (the rest is random padding)
        return shard.hash(h, Y).n_found

    shard = WideShard(cfg, 8, ShardLayout.strided(300, 1))
    assert shard.occupancy()["max_offered"] == 0  # reading the fill builds nothing
    for _ in range(3):
        assert (found(shard) == 1).all()  # its label only
        shard.forward(h, Y)
        shard.backward(np.zeros(16, np.float32))
    assert shard.occupancy()["max_offered"] > 0  # built by the rebuild after step 3
    assert (found(shard) > 1).any()
    other = WideShard(cfg, 8, ShardLayout.strided(300, 1))
    assert other.index.counts.sum() == 300 * cfg.L  # built on first read
    assert (found(other) > 1).any()


def test_a_layer_that_never_rebuilds_trains_on_labels_and_padding_and_serves_fresh_tables():
    """rebuild_every=0: training retrieves nothing, whatever the tables hold, and hashes
    nothing; inference still finds neurons, in tables of the rows as they are now."""
    from dslide_dask.model.layout import ShardLayout
    from dslide_dask.model.wide_shard import WideShard

    cfg, h, Y = _small_layer(0)
    shard = WideShard(cfg, 8, ShardLayout.strided(300, 1))
    before = shard.index.ids.copy()  # built, as inference would: training still retrieves nothing
    hashed = []
    shard._index.buckets = lambda v: hashed.append(v) or np.zeros((len(v), cfg.L), np.int32)
    for _ in range(5):
        sets = shard.hash(h, Y)
        assert (sets.n_found == 1).all() and (sets.n_active == 20).all()  # label + padding
        shard.gather(sets)
        shard.backward(np.zeros(16, np.float32))
    assert hashed == [] and shard.schedule.n_rebuilds == 0
    del shard._index.buckets
    fresh = WideShard(cfg, 8, ShardLayout.strided(300, 1))
    fresh.set_state(*shard.state())
    assert not np.array_equal(shard.index.ids, before)  # rebuilt from the rows as trained
    assert np.array_equal(shard.index.counts, fresh.index.counts)
    assert np.array_equal(shard.index.ids, fresh.index.ids)

"""Shard placement from the scheduler's view of the workers."""

import pytest

from dslide_dask import SlideConfig
from dslide_dask.distributed.placement import place_shards, shard_bytes

CFG = SlideConfig(L=10, range_pow=10, bucket_capacity=16)


def workers(*specs):
    return {
        f"tcp://10.0.0.{i}:1": {"nthreads": t, "memory_limit": m} for i, (t, m) in enumerate(specs)
    }


def test_one_shard_per_worker_sized_by_threads():
    placement = place_shards(workers((1, 4 << 30), (2, 4 << 30)), CFG, 3000, coordinator_load=0)
    # the worker with more threads comes first and gets twice the neurons
    assert placement.workers == ("tcp://10.0.0.1:1", "tcp://10.0.0.0:1")
    assert [placement.layout.size(s) for s in range(2)] == [2000, 1000]


def test_the_coordinators_worker_gets_a_smaller_shard():
    placement = place_shards(workers((1, 0), (1, 0)), CFG, 19_000, coordinator_load=0.1)
    assert [placement.layout.size(s) for s in range(2)] == [9000, 10_000]
    single = place_shards(workers((1, 0)), CFG, 100, coordinator_load=0.1)
    assert single.layout.size(0) == 100
    with pytest.raises(ValueError, match=r"coordinator_load must be in \[0, 1\), got 1.5"):
        place_shards(workers((1, 0)), CFG, 100, coordinator_load=1.5)


def test_n_shards_picks_the_largest_workers():
    placement = place_shards(workers((1, 0), (4, 0), (2, 0)), CFG, 100, n_shards=2)
    assert placement.workers == ("tcp://10.0.0.1:1", "tcp://10.0.0.2:1")


def test_bad_shard_counts_and_small_workers_are_refused():
    with pytest.raises(ValueError, match=r"n_shards must be in \[1, 2\] \(the workers\), got 3"):
        place_shards(workers((1, 0), (1, 0)), CFG, 100, n_shards=3)
    with pytest.raises(ValueError, match="the Dask cluster has no workers"):
        place_shards({}, CFG, 100)
    need = shard_bytes(CFG, 1_000_000)
    with pytest.raises(ValueError, match=r"shard 0 needs ~.* GiB but worker .* has"):
        place_shards(workers((1, need)), CFG, 1_000_000)

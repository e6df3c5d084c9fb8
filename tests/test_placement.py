"""Shard placement from the scheduler's view of the workers."""

import pytest

from dslide_dask import SlideConfig
from dslide_dask.distributed.memory_plan import RUNTIME_BYTES
from dslide_dask.distributed.placement import place_shards, shard_bytes
from dslide_dask.errors import MemoryPlanError

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
    with pytest.raises(MemoryPlanError, match=r"does not fit 1 worker\(s\): it needs .* GiB"):
        place_shards(workers((1, need)), CFG, 1_000_000)


#: hidden 64 over 100K features, 500K labels: 0.15 GiB of weights in the output layer
BIG = SlideConfig(hidden=(64,), L=10, range_pow=10, bucket_capacity=16, beta1=0.9)


def test_the_plan_says_what_each_worker_holds_and_adds_up():
    placement = place_shards(workers((1, 8 << 30), (1, 8 << 30)), BIG, 500_000, n_features=100_000)
    plan = placement.plan
    assert [w.neurons for w in plan.workers] == [placement.layout.size(s) for s in range(2)]
    first, second = plan.workers
    assert first.role == "hidden layers, shard 0" and second.role == "shard 1"
    hidden_weights = 4 * (100_000 * 64 + 64)
    assert first.weights == 4 * first.neurons * 65 + hidden_weights
    assert second.weights == 4 * second.neurons * 65
    # beta1 > 0: both Adam moments, and each row's update count
    assert second.optimizer == 2 * second.weights + 4 * second.neurons
    assert plan.total == sum(w.total for w in plan.workers) and plan.fits
    assert "hidden layers, shard 0" in plan.table()


def test_shards_follow_memory_on_a_heterogeneous_cluster():
    """A 16-thread worker with little memory beside a 2-thread one with much: by threads
    the first would take 8/9 of the rows and not fit; by memory it fits."""
    need = shard_bytes(BIG, 500_000)
    small, large = int((RUNTIME_BYTES + 0.6 * need) / 0.8), int((RUNTIME_BYTES + 2 * need) / 0.8)
    placement = place_shards(workers((16, small), (2, large)), BIG, 500_000, coordinator_load=0)
    sizes = {a: placement.layout.size(s) for s, a in enumerate(placement.workers)}
    assert sizes["tcp://10.0.0.0:1"] < sizes["tcp://10.0.0.1:1"]
    assert placement.plan.fits


def test_a_model_too_big_for_one_small_worker_is_refused_before_anything_is_built():
    """The 0.8B-parameter bar in small: what fits two 6 GiB workers does not fit one, and
    the refusal gives the plan and what would make it fit."""
    cfg = SlideConfig(hidden=(256,), L=50, beta1=0.9)
    n_labels = 2_000_000  # 2.0M x 257 x 12 bytes: 5.7 GiB of weights and Adam moments
    six = 6 << 30
    with pytest.raises(MemoryPlanError) as refused:
        place_shards(workers((2, six)), cfg, n_labels, n_features=50_000)
    message = str(refused.value)
    assert "does not fit 1 worker(s)" in message and "over 80% of its limit" in message
    assert "or more workers like these (6.00 GiB)" in message
    assert "beta1=0 (no first Adam moment" in message
    assert place_shards(workers((2, six), (2, six), (2, six)), cfg, n_labels).plan.fits


def test_a_hidden_layer_that_would_crowd_the_coordinator_is_split_by_units():
    """By bytes, not by a flag: 337K features x 1,024 units (345M parameters, 2.6 GiB
    with one Adam moment) would take over half of a 6 GiB worker's budget, so the
    placement splits it over the workers; 256 units stay whole on the coordinator."""
    from dslide_dask.distributed.placement import place_shards

    workers = {f"tcp://w{i}": {"nthreads": 1, "memory_limit": 6 * 2**30} for i in range(4)}
    wide = SlideConfig(hidden=(1024,), beta1=0.0)
    placement = place_shards(workers, wide, 100_000, n_features=337_067)
    assert placement.hidden_units == ((0, 256), (256, 512), (512, 768), (768, 1024))
    assert [w.role for w in placement.plan.workers] == [
        f"hidden units, shard {s}" for s in range(4)
    ]
    narrow = SlideConfig(hidden=(256,), beta1=0.0)
    assert place_shards(workers, narrow, 100_000, n_features=337_067).hidden_units == ()
    asked = place_shards(workers, narrow, 100_000, n_features=337_067, hidden_shards=2)
    assert asked.hidden_units == ((0, 128), (128, 256))
    deep = SlideConfig(hidden=(256, 128))
    with pytest.raises(ValueError, match=r"only a one-layer hidden stack splits by units"):
        place_shards(workers, deep, 100_000, n_features=337_067, hidden_shards=2)


def test_a_model_loaded_to_answer_is_planned_without_its_optimiser_state():
    """SlideClassifier.load(..., answering=True) holds no Adam moments: a worker with room
    to answer with the model but not to train it takes it."""
    args = (BIG, 500_000)
    roomy = workers((1, 8 << 30))
    training = place_shards(roomy, *args, n_features=100_000).plan.workers[0]
    answering = place_shards(roomy, *args, n_features=100_000, answering=True).plan.workers[0]
    assert training.optimizer > 0 and answering.optimizer == 0
    assert answering.weights == training.weights and answering.tables == training.tables
    between = int((answering.total + training.optimizer / 2) / 0.8)  # 80% of the limit
    with pytest.raises(MemoryPlanError, match=r"does not fit 1 worker\(s\)"):
        place_shards(workers((1, between)), *args, n_features=100_000)
    plan = place_shards(workers((1, between)), *args, n_features=100_000, answering=True).plan
    assert plan.fits and plan.workers[0].optimizer == 0

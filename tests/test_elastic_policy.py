"""The decisions of elastic training, without a cluster: which workers the scheduler
was asked to retire (its event log), when a worker that joins is worth a move, whether a
streamed move fits in the workers' memory, and what a move costs (the steps it slowed
while it was prepared). The moves themselves, on real LocalClusters, are in
test_elastic_leave and test_elastic_join.
"""

import pytest

from dslide_dask.distributed.memory_plan import (
    BUDGET,
    RUNTIME_BYTES,
    fits_while_moving,
    memory_plan,
)
from dslide_dask.distributed.moves.policy import Move, join_pays, retire_requests
from dslide_dask.distributed.moves.rebalance import FollowsTheCluster
from dslide_dask.model.config import SlideConfig


def test_retire_requests_come_from_the_schedulers_event_log():
    events = [
        (1.0, {"action": "retire-workers", "retired": [], "could-not-retire": ["tcp://a"]}),
        (2.0, {"action": "add-worker", "worker": "tcp://b"}),
        (3.0, {"action": "retire-workers", "retired": ["tcp://c"], "could-not-retire": []}),
        (4.0, {"action": "retire-workers", "could-not-retire": ["tcp://d"]}),
        (5.0, "not a dict"),
    ]
    assert retire_requests(events, 0.0) == {"tcp://a", "tcp://d"}
    assert retire_requests(events, 2.0) == {"tcp://d"}


def test_joining_pays_only_when_the_time_saved_outweighs_the_move():
    assert join_pays(1000, 0.1, workers_now=2, workers_then=4, move_seconds=10)  # 50 s saved
    assert not join_pays(100, 0.1, workers_now=2, workers_then=4, move_seconds=10)  # 5 s
    assert not join_pays(10**6, 0.1, workers_now=4, workers_then=4, move_seconds=1)
    assert not join_pays(0, 1.0, workers_now=1, workers_then=8, move_seconds=0.1)


def test_a_streamed_move_needs_room_for_the_slices_under_way_not_a_copy_of_every_row():
    cfg = SlideConfig(hidden=(128,)).for_data(670_091)
    copied = 64 << 20

    def plans(limit: int):
        workers = {f"tcp://w{i}": {"memory_limit": limit} for i in range(4)}
        old = memory_plan(cfg, 135_909, dict(list(workers.items())[:2]), [335_046, 335_045])
        new = memory_plan(cfg, 135_909, workers, [167_523, 167_523, 167_523, 167_522])
        return old, new

    old, new = plans(0)
    w_old, w_new = old.workers[0], new.workers[0]
    room = w_old.total + w_new.total - RUNTIME_BYTES + copied + (w_old.weights // 2)
    old, new = plans(int(room / BUDGET))
    assert fits_while_moving(old, new, copied)  # the old part, the new part, two slices
    assert not fits_while_moving(old, new)  # with a copy of every row handed on


def test_a_moves_cost_counts_the_steps_slowed_while_it_was_prepared():
    run = FollowsTheCluster()
    run.history = [{"seconds": 0.1}] * 20 + [{"seconds": 0.3}] * 10
    assert run._slowdown(10) == pytest.approx(2.0)  # 10 steps, 0.2 s slower each
    assert run._slowdown(0) == 0 and run._slowdown(30) == 0  # nothing before to compare
    move = Move(50, (), ("w",), 3, seconds=0.5, slowdown_seconds=2.0)
    assert move.cost_seconds == pytest.approx(2.5) and move.began_at == 50

"""Workers that leave and join mid-run, on real LocalClusters: a worker asked to retire
hands its rows off at the next step boundary (no step redone) and is retired; a worker
that joins is used when the move pays."""

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
from distributed import Client, wait

from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.data.stream import Stream
from dslide_dask.distributed import DistributedTrainer
from dslide_dask.distributed.memory_plan import (
    BUDGET,
    RUNTIME_BYTES,
    fits_while_moving,
    memory_plan,
)
from dslide_dask.distributed.moves.policy import (
    LEAVE_TOPIC,
    ElasticPolicy,
    Move,
    join_pays,
    retire_requests,
)
from dslide_dask.distributed.moves.rebalance import FollowsTheCluster
from dslide_dask.model.config import SlideConfig

from .test_resilience import BATCH, CFG, cluster


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


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("who", "live"),
    [(0, True), (2, True), (2, False)],
    ids=["coordinator+shard0", "shard2", "shard2-through-storage"],
)
def test_a_retired_worker_hands_its_rows_off_and_goes(tiny, tmp_path, who, live):
    """``client.retire_workers`` mid-run: Dask gives up on a worker holding an actor; the
    trainer sees that, moves the model off it at the next step boundary (worker to
    worker, or through a checkpoint), lets the worker go and goes on from that very
    step on the others. Every step is recorded once, none is redone, no crash recovery
    happens, and the model learns as an undisturbed one."""
    train, test = tiny
    policy = CheckpointPolicy(str(tmp_path / "ckpt"))  # no periodic checkpoints
    stream = Stream(BATCH, epochs=3)
    with cluster(3) as lc, Client(lc) as client:
        with DistributedTrainer(client, CFG, train.n_features, train.n_labels) as clean:
            clean.train(train, stream)
            p1_clean = clean.evaluate(test)["P@1"]
        with DistributedTrainer(
            client,
            CFG,
            train.n_features,
            train.n_labels,
            checkpoint=policy,
            elastic=ElasticPolicy(join=False, live=live),
        ) as trainer:
            leaving = trainer.placement.workers[who]
            asked = []

            def retire_at_step_25(record):
                if record["step"] == 25:
                    asked.append(client.retire_workers([leaving]))

            history = trainer.train(train, stream, retire_at_step_25)
            assert asked == [{}]  # Dask alone could not retire it: it held an actor
            (move,) = trainer.moves
            # asked at 25: from the boundary at 30 (live: prepared while training goes on)
            assert move.began_at == 30
            assert move.leaving == (leaving,) and move.workers == 2
            assert move.live == live
            # a live move switches at a later boundary: the old model trains meanwhile
            assert move.steps_while_preparing >= 10 if live else move.steps_while_preparing == 0
            assert (tmp_path / "ckpt").exists() != live  # a live move writes nothing
            assert leaving not in client.scheduler_info(n_workers=-1)["workers"]  # retired
            assert leaving not in trainer.placement.workers
            assert trainer.recoveries == []
            assert [r["step"] for r in history] == list(range(1, 121))  # each step once
            p1 = trainer.evaluate(test)["P@1"]
    assert p1 > 0.3
    assert abs(p1 - p1_clean) < 0.05, (p1, p1_clean)


def _dslide_leave(address: str, worker: str, timeout: float) -> subprocess.Popen:
    """What a Kubernetes preStop hook runs in a worker's container."""
    argv = ["leave", "--scheduler-address", address, "--worker", worker, "--timeout", str(timeout)]
    return subprocess.Popen(
        [sys.executable, "-m", "dslide_workflows", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _refused(client, address: str) -> bool:
    """Whether Dask has refused to retire ``address`` (it holds an actor)."""
    events = client.get_events("all")
    return any(address in (m.get("could-not-retire") or ()) for _, m in events)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dslide_leave_returns_once_the_run_has_moved_the_workers_rows_off(tiny, tmp_path):
    train, _ = tiny
    policy = CheckpointPolicy(str(tmp_path / "ckpt"))
    with (
        cluster(3) as lc,
        Client(lc) as client,
        DistributedTrainer(
            client,
            CFG,
            train.n_features,
            train.n_labels,
            checkpoint=policy,
            elastic=ElasticPolicy(join=False),
        ) as trainer,
    ):
        leaving = trainer.placement.workers[1]
        name = str(client.scheduler_info(n_workers=-1)["workers"][leaving]["name"])
        hooks = []

        def pre_stop_at_step_15(record):
            if record["step"] == 15:
                hooks.append(_dslide_leave(lc.scheduler_address, name, 120))
                deadline = time.monotonic() + 60
                while not _refused(client, leaving) and time.monotonic() < deadline:
                    time.sleep(0.1)  # the hook has asked (its Python takes a while to start)

        history = trainer.train(train, Stream(BATCH, epochs=2), pre_stop_at_step_15)
        out, err = hooks[0].communicate(timeout=60)
        assert hooks[0].returncode == 0, err
        assert out.strip() == f"dslide leave: {leaving} retired"
        (move,) = trainer.moves
        assert move.began_at == 20 and move.leaving == (leaving,)
        assert leaving not in client.scheduler_info(n_workers=-1)["workers"]
        assert trainer.recoveries == []
        assert [r["step"] for r in history] == list(range(1, 81))


class _Holder:
    """Any actor: Dask does not retire a worker that holds one."""


@pytest.mark.slow
def test_dslide_leave_says_when_no_run_takes_the_rows_or_there_is_no_such_worker():
    with cluster(2) as lc, Client(lc) as client:
        worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[1]
        holder = client.submit(_Holder, actor=True, workers=[worker]).result()
        hook = _dslide_leave(lc.scheduler_address, worker, 2)
        out, _ = hook.communicate(timeout=60)
        assert hook.returncode == 1
        assert out.startswith(f"dslide leave: {worker} still there after 2 s: no training run")
        del holder
        hook = _dslide_leave(lc.scheduler_address, "no-such-worker", 2)
        out, _ = hook.communicate(timeout=60)
        assert hook.returncode == 0
        assert "no worker 'no-such-worker' in the cluster: nothing to do" in out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_that_joins_gets_a_shard_when_the_move_pays(tiny, tmp_path):
    train, _ = tiny
    policy = CheckpointPolicy(str(tmp_path / "ckpt"))
    # moving is priced as free, so any worker that joins is worth using
    elastic = ElasticPolicy(move_bytes_per_second=1e15)
    with (
        cluster(2) as lc,
        Client(lc) as client,
        DistributedTrainer(
            client, CFG, train.n_features, train.n_labels, checkpoint=policy, elastic=elastic
        ) as trainer,
    ):
        before = set(trainer.placement.workers)

        def grow_at_step_15(record):
            if record["step"] == 15:
                lc.scale(3)
                client.wait_for_workers(3)

        history = trainer.train(train, Stream(BATCH, epochs=2), grow_at_step_15)
        (move,) = trainer.moves
        assert move.began_at == 20 and move.leaving == () and len(move.joined) == 1
        assert set(trainer.placement.workers) == before | set(move.joined)
        assert [r["step"] for r in history] == list(range(1, 81))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_adaptive_scaling_shrinks_the_cluster_through_a_hand_off(tiny, tmp_path):
    """``cluster.adapt`` would close a worker by force once its retirement failed; the
    scheduler plugin keeps shard workers from being picked and asks for a hand-off of
    one instead, so the cluster shrinks to the scaler's minimum with no step redone."""
    train, _ = tiny
    policy = CheckpointPolicy(str(tmp_path / "ckpt"))
    with (
        cluster(3) as lc,
        Client(lc) as client,
        DistributedTrainer(
            client,
            CFG,
            train.n_features,
            train.n_labels,
            checkpoint=policy,
            elastic=ElasticPolicy(join=False),
        ) as trainer,
    ):
        adaptive = []

        def shrink_at_step_15(record):
            if record["step"] == 15:
                adaptive.append(lc.adapt(minimum=2, maximum=2, interval="100ms"))
            elif record["step"] == 30:  # until the scaler has asked, however slow
                deadline = time.monotonic() + 60
                while not client.get_events(LEAVE_TOPIC) and time.monotonic() < deadline:
                    time.sleep(0.05)

        history = trainer.train(train, Stream(BATCH, epochs=3), shrink_at_step_15)
        (move,) = trainer.moves
        assert move.began_at == 30 and len(move.leaving) == 1
        assert trainer.recoveries == []
        assert len(trainer.placement.workers) == 2
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2
        assert [r["step"] for r in history] == list(range(1, 121))
        adaptive[0].stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chaos_short_joins_retirements_and_kills(tiny, tmp_path):
    """Seeded chaos at step boundaries: a worker retired, one joining, one SIGKILLed, one
    more retired. The run finishes, every step is recorded once (the killed worker's lost
    steps are redone from the last checkpoint, the rest never), no worker process is left
    behind, and the model learns as an undisturbed one."""
    train, test = tiny
    rng = np.random.default_rng(7)
    policy = CheckpointPolicy(str(tmp_path / "ckpt"), every_steps=20)
    stream = Stream(BATCH, epochs=4)
    pids = set()
    with cluster(3) as lc, Client(lc) as client:
        with DistributedTrainer(client, CFG, train.n_features, train.n_labels) as clean:
            clean.train(train, stream)
            p1_clean = clean.evaluate(test)["P@1"]
        with DistributedTrainer(
            client, CFG, train.n_features, train.n_labels, checkpoint=policy, replace_wait=30
        ) as trainer:
            pids |= set(client.run(os.getpid).values())

            done = set()

            def chaos(record):
                step, model = record["step"], list(trainer.placement.workers)
                if step in done:  # a step redone after the kill: its event happened
                    return
                done.add(step)
                if step in (25, 115):
                    client.retire_workers([model[rng.integers(len(model))]])
                elif step == 55:  # the retired worker is still in the cluster's spec
                    there = len(client.scheduler_info(n_workers=-1)["workers"])
                    lc.scale(len(lc.worker_spec) + 1)
                    client.wait_for_workers(there + 1, timeout=60)
                elif step == 85:
                    victim = model[rng.integers(len(model))]
                    os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
                pids.update(client.run(os.getpid, on_error="ignore").values())

            history = trainer.train(train, stream, chaos)
            assert [r["step"] for r in history] == list(range(1, 161))
            # the two retirements hand off at the next boundary; whether the worker that
            # joined is worth a move depends on measured step and move times
            assert [m.began_at for m in trainer.moves if m.leaving] == [30, 120]
            assert len(trainer.recoveries) == 1 and trainer.recoveries[0].restored_step == 80
            p1 = trainer.evaluate(test)["P@1"]
    assert abs(p1 - p1_clean) < 0.05, (p1, p1_clean)
    assert not [p for p in pids if psutil.pid_exists(p)]  # no worker left behind


def _weights(trainer) -> list[np.ndarray]:
    """Every weight of the model, the output layer's in global neuron order (whatever
    the shards): what a move must carry over bit for bit."""
    layout = trainer.placement.layout
    W = np.zeros((layout.n_neurons, CFG.hidden[-1]), np.float32)
    bias = np.zeros(layout.n_neurons, np.float32)
    for s, (W_s, bias_s) in enumerate(trainer.shard_weights()):
        rows = layout.global_ids(s, np.arange(len(W_s)))
        W[rows], bias[rows] = W_s, bias_s
    return [W, bias, *trainer.hidden_weights()]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("hidden_shards", "split"),
    [(1, [(), ()]), (3, [((0, 32), (32, 64)), ((0, 21), (21, 42), (42, 64))])],
    ids=["hidden layer whole", "hidden layer split 2 -> 3 ways"],
)
def test_a_live_rebalance_moves_every_row_worker_to_worker_unchanged(
    tiny, tmp_path, hidden_shards, split
):
    """Onto a worker that joined, with no checkpoint store at all: every output row, the
    hidden layer (whole, or its units re-split over the new workers) and the step come
    over bit for bit, only the new worker's share of the rows crosses the network, and
    training goes on from there."""
    train, test = tiny
    with (
        cluster(2) as lc,
        Client(lc) as client,
        DistributedTrainer(
            client, CFG, train.n_features, train.n_labels, hidden_shards=hidden_shards
        ) as trainer,
    ):
        trainer.train(train, Stream(BATCH, epochs=1))
        before = _weights(trainer)
        old = trainer.placement
        assert old.hidden_units == split[0]
        assert trainer.rebalance() is None  # no new worker: nothing to do
        lc.scale(3)
        client.wait_for_workers(3)
        move = trainer.rebalance()
        assert move is not None and move.live and move.workers == 3
        new = trainer.placement
        assert new.hidden_units == split[1]
        assert new.workers[:2] == old.workers  # the coordinator stays where it was
        joined_rows = new.layout.size(2)
        assert move.rows_moved == joined_rows  # only the joiner's rows travel
        assert joined_rows == pytest.approx(train.n_labels / 3, rel=0.1)
        _assert_same(_weights(trainer), before)
        assert {i["steps"] for i in trainer.shard_info()} == {40}
        history = trainer.train(train, Stream(BATCH, epochs=2))
        assert [r["step"] for r in history] == list(range(41, 121))
        assert trainer.evaluate(test)["P@1"] > 0.3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_move_prepared_while_the_model_trains_on_takes_its_state_at_the_switch(tiny):
    """The new model is built from a copy taken while the old one trains on; at the
    switch every output row, the hidden layer and the step are copied again as they are
    then, bit for bit, and training goes on from there."""
    train, test = tiny
    with (
        cluster(2) as lc,
        Client(lc) as client,
        DistributedTrainer(client, CFG, train.n_features, train.n_labels, elastic=None) as trainer,
    ):
        trainer.train(train, Stream(BATCH, epochs=1))
        lc.scale(3)
        client.wait_for_workers(3)
        assert trainer.rebalance(wait=False) is None  # prepared, not switched to
        trainer.train(train, Stream(BATCH, epochs=1))  # steps 41-80 on the old model
        assert len(trainer.placement.workers) == 2
        before = _weights(trainer)
        move = trainer.rebalance()
        assert move.live and move.workers == 3 and (move.began_at, move.at_step) == (40, 80)
        _assert_same(_weights(trainer), before)
        assert {i["steps"] for i in trainer.shard_info()} == {80}
        history = trainer.train(train, Stream(BATCH, epochs=1))
        assert [r["step"] for r in history] == list(range(81, 121))
        assert trainer.evaluate(test)["P@1"] > 0.3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rows_streamed_while_the_model_trains_on_are_as_they_are_at_the_switch(tiny):
    """The old shards stream their rows to the new ones while training goes on (a slice
    a step, then each step's update, replayed there); when training switches to the new
    model mid-run, it holds every output row and the hidden layer as the old one has them
    then, bit for bit."""
    train, test = tiny
    switches = []

    class Recording(DistributedTrainer):
        def _switch(self):
            before = _weights(self)
            super()._switch()
            switches.append((self.step, before, _weights(self)))

    with (
        cluster(2) as lc,
        Client(lc) as client,
        Recording(client, CFG, train.n_features, train.n_labels) as trainer,
    ):
        trainer.train(train, Stream(BATCH, epochs=1))
        lc.scale(3)
        client.wait_for_workers(3)
        trainer.rebalance(wait=False)
        wait(list(trainer._prepared.launch.futures))  # streaming starts at the next boundary
        history = trainer.train(train, Stream(BATCH, epochs=2))
        assert [r["step"] for r in history] == list(range(41, 121))
        ((step, before, after),) = switches
        assert 40 < step < 120  # at a boundary mid-run, not when the data ran out
        _assert_same(after, before)
        (move,) = trainer.moves
        assert move.live and move.at_step == step and move.workers == 3
        assert trainer.evaluate(test)["P@1"] > 0.3


@contextlib.contextmanager
def _trained_then_joined(train):
    """A trainer that took 40 steps on 2 workers, with a third just joined: ``(client,
    trainer, the joined worker)``."""
    with (
        cluster(2) as lc,
        Client(lc) as client,
        DistributedTrainer(client, CFG, train.n_features, train.n_labels) as trainer,
    ):
        trainer.train(train, Stream(BATCH, epochs=1))
        before = set(trainer.placement.workers)
        lc.scale(3)
        client.wait_for_workers(3)
        (joined,) = set(client.scheduler_info(n_workers=-1)["workers"]) - before
        yield client, trainer, joined


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_asked_to_leave_while_a_move_is_prepared_leaves_after_it(tiny):
    """A request to leave that comes while a join is being prepared is not swallowed by
    the switch: the worker's rows are handed off at a boundary after it, and it goes."""
    train, _ = tiny
    with _trained_then_joined(train) as (client, trainer, _):
        leaving = trainer.placement.workers[1]
        assert trainer.rebalance(wait=False) is None  # prepared, not switched to
        assert client.retire_workers([leaving]) == {}  # refused: it holds actors
        join = trainer.rebalance()  # the switch
        assert join.workers == 3 and join.leaving == () and join.at_step == 40
        history = trainer.train(train, Stream(BATCH, epochs=2))
        assert trainer.moves[-1].leaving == (leaving,)  # asked before the switch
        assert trainer.moves[-1].workers == 2 and len(trainer.moves) == 2
        assert leaving not in trainer.placement.workers
        assert leaving not in client.scheduler_info(n_workers=-1)["workers"]  # retired
        assert [r["step"] for r in history] == list(range(41, 121))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_leave_asked_while_a_join_is_prepared_does_not_wait_for_it(tiny):
    """Training drops a prepared join that would keep a worker asked to leave, and moves
    once, off that worker and onto the one that joined."""
    train, _ = tiny
    with _trained_then_joined(train) as (client, trainer, joined):
        leaving = trainer.placement.workers[1]
        assert trainer.rebalance(wait=False) is None  # a join prepared
        assert client.retire_workers([leaving]) == {}
        history = trainer.train(train, Stream(BATCH, epochs=2))
        (move,) = trainer.moves
        assert (move.leaving, move.joined, move.workers) == ((leaving,), (joined,), 2)
        assert move.began_at == 50  # the first boundary: the join was dropped for it
        assert leaving not in client.scheduler_info(n_workers=-1)["workers"]  # retired
        assert [r["step"] for r in history] == list(range(41, 121))


def _no_room_for_a_shard_here() -> None:
    """In a worker process: building a shard fails, as on a node without room for it."""
    from dslide_dask.distributed import shard_actor

    def no_room(*args, **kwargs):
        raise MemoryError("no room for a shard here")

    shard_actor.WideShard = no_room


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_joined_worker_the_model_cannot_be_built_on_is_left_out(tiny):
    """A join whose new model fails to build costs the run neither its model nor a
    restore: a warning says what failed, training goes on where it was, and the worker
    is not tried again."""
    train, _ = tiny
    with _trained_then_joined(train) as (client, trainer, joined):
        old = trainer.placement.workers
        client.run(_no_room_for_a_shard_here, workers=[joined])
        match = r"could not build the model on 3 workers \(MemoryError: no room for a shard"
        with pytest.warns(RuntimeWarning, match=match):
            assert trainer.rebalance() is None
        assert trainer.placement.workers == old
        history = trainer.train(train, Stream(BATCH, epochs=1))
        assert trainer.rebalance() is None  # nothing left to join
        assert trainer.placement.workers == old
        assert trainer.moves == [] and trainer.recoveries == []
        assert [r["step"] for r in history] == list(range(41, 81))


def _no_room_for_rows_here() -> None:
    """In a worker process: a shard cannot take rows, as on a node that runs out of room."""
    from dslide_dask.model.wide_shard import WideShard

    def no_room(*args, **kwargs):
        raise MemoryError("no room for the rows here")

    WideShard.put_rows = no_room


def _mirror_threads() -> int:
    gc.collect()  # released actors in reference cycles
    return sum(t.name == "dslide-mirror" for t in threading.enumerate())


def _mirror_threads_left(client: Client, within: float = 60.0) -> int:
    """The mirror threads still alive once the released actors have gone: the scheduler
    forgets them, then the worker drops them, and a thread finishes the messages it has
    (on a loaded machine that takes a while, so this waits for it)."""
    deadline = time.monotonic() + within
    while (left := sum(client.run(_mirror_threads).values())) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_joined_worker_that_cannot_take_the_streamed_rows_is_left_out(tiny):
    """A new shard that fails to take the rows streamed to it drops the move as a failed
    build does: a warning, training goes on with the model it has, nothing is redone, and
    no thread of the dropped model is left behind."""
    train, _ = tiny
    with _trained_then_joined(train) as (client, trainer, joined):
        old = trainer.placement.workers
        client.run(_no_room_for_rows_here, workers=[joined])
        trainer.rebalance(wait=False)
        with pytest.warns(RuntimeWarning, match=r"on 3 workers \(.*no room for the rows here"):
            history = trainer.train(train, Stream(BATCH, epochs=2))
        assert trainer.placement.workers == old
        assert trainer.moves == [] and trainer.recoveries == []
        assert [r["step"] for r in history] == list(range(41, 121))
        assert _mirror_threads_left(client) == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_the_rest_cannot_replace_stays_and_the_run_goes_on(tiny, tmp_path):
    """If the workers that would stay cannot hold the model (the plan says so), a worker
    asked to leave is not let go: the run trains on with the model where it is."""
    from dslide_dask.errors import MemoryPlanError

    train, _ = tiny
    with (
        cluster(3) as lc,
        Client(lc) as client,
        DistributedTrainer(
            client,
            CFG,
            train.n_features,
            train.n_labels,
            elastic=ElasticPolicy(join=False),
        ) as trainer,
    ):
        leaving = trainer.placement.workers[2]

        def too_small(*args):
            raise MemoryPlanError("the model does not fit 2 worker(s)")

        trainer._place = too_small  # as a plan of the two that stay would say

        def retire_at_step_5(record):
            if record["step"] == 5:
                assert client.retire_workers([leaving]) == {}

        history = trainer.train(train, Stream(BATCH, epochs=1), retire_at_step_5)
        assert trainer.moves == [] and trainer.recoveries == []
        assert leaving in client.scheduler_info(n_workers=-1)["workers"]
        assert leaving in trainer.placement.workers
        assert [r["step"] for r in history] == list(range(1, 41))

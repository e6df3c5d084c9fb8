"""Workers that join mid-run, on real LocalClusters: a worker that joins is used when
the move pays; a live rebalance moves every row worker to worker, bit for bit, only the
joiner's share crossing the network, prepared (rows streamed) while the model trains on
and taking its state at the switch; a worker asked to leave while a join is prepared
leaves after it, or the join is dropped for it; a joined worker the model cannot be
built on, or that cannot take the streamed rows, is left out and the run goes on.
"""

import contextlib
import gc
import threading
import time

import numpy as np
import pytest
from distributed import Client, wait

from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.data.stream import Stream
from dslide_dask.distributed import DistributedTrainer
from dslide_dask.distributed.moves.policy import ElasticPolicy

from .test_resilience import BATCH, CFG, cluster


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
        client.run(gc.disable)  # only the move itself can free the old model
        trainer.train(train, Stream(BATCH, epochs=1))
        before = _weights(trainer)
        old = trainer.placement
        assert old.hidden_units == split[0]
        assert trainer.rebalance() is None  # no new worker: nothing to do
        lc.scale(3)
        client.wait_for_workers(3)
        client.run(gc.disable)
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
        # the old model's shards are gone from the workers that stay: only the new 3 are left
        assert sum(client.run(_shards_alive).values()) == 3


def _shards_alive() -> int:
    """Wide-layer shards alive in this worker process (run on each worker)."""
    from dslide_dask.model.wide_shard import WideShard

    return sum(isinstance(o, WideShard) for o in gc.get_objects())


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

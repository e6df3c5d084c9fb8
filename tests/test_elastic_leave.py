"""Workers that leave mid-run, on real LocalClusters: a worker asked to retire
(``client.retire_workers``, ``dslide leave`` as a Kubernetes preStop hook runs it) hands
its rows off at the next step boundary, no step redone, and is retired; adaptive scaling
closes no shard worker; ``dslide leave`` says when no run takes the rows; a worker the rest
cannot replace stays. Last, seeded chaos at step boundaries (retirements, a join, a
SIGKILL): the short, step-driven version of test_chaos.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from distributed import Client

from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.data.stream import Stream
from dslide_dask.distributed import DistributedTrainer
from dslide_dask.distributed.moves.policy import ElasticPolicy

from .test_resilience import BATCH, CFG, cluster


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
def test_adaptive_scaling_closes_no_shard_worker_and_shrinks_once_the_run_is_over(tiny, tmp_path):
    """``cluster.adapt`` asks which workers could close at every interval (a question, as
    a ``/metrics`` scrape is) and would close a worker by force once its retirement
    failed: the scheduler plugin offers it no worker that holds a shard, and the question
    asks nothing of the run. So the run keeps its three workers (nothing moved, nothing
    restored, every step once); once it is over, the cluster shrinks to the scaler's
    size."""
    train, _ = tiny
    policy = CheckpointPolicy(str(tmp_path / "ckpt"))
    with cluster(3) as lc, Client(lc) as client:
        adaptive = []
        with DistributedTrainer(
            client,
            CFG,
            train.n_features,
            train.n_labels,
            checkpoint=policy,
            elastic=ElasticPolicy(join=False),
        ) as trainer:

            def adapt_at_step_15(record):
                if record["step"] == 15:
                    adaptive.append(lc.adapt(minimum=2, maximum=2, interval="100ms"))
                elif record["step"] == 30:  # the scaler has asked many times by now
                    deadline = time.monotonic() + 60
                    while adaptive[0].state != "running" and time.monotonic() < deadline:
                        time.sleep(0.05)
                    time.sleep(2.0)

            history = trainer.train(train, Stream(BATCH, epochs=3), adapt_at_step_15)
            assert trainer.moves == [] and trainer.recoveries == []
            assert len(trainer.placement.workers) == 3
            assert len(client.scheduler_info(n_workers=-1)["workers"]) == 3
            assert [r["step"] for r in history] == list(range(1, 121))
        deadline = time.monotonic() + 120  # the run's actors released: the scaler's turn
        while len(client.scheduler_info(n_workers=-1)["workers"]) > 2:
            assert time.monotonic() < deadline, "the cluster did not shrink after the run"
            time.sleep(0.2)
        adaptive[0].stop()


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

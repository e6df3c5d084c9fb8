"""Graph step mode: steps as named tasks on a real LocalCluster, equal to actor steps."""

import os
import re
import signal

import numpy as np
import pytest
from distributed import Client, LocalCluster, performance_report

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.data.stream import Stream
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.distributed import DistributedTrainer, ShardLostError
from dslide_dask.distributed.graph_step import PHASES

PARAMS = dict(hidden=(64,), K=3, L=20, range_pow=9, lr=1e-2, seed=0)


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def tiny():
    return make_synthetic("tiny", seed=0)


def _train(client, data, step_mode):
    cfg = SlideConfig(**PARAMS)
    with DistributedTrainer(
        client, cfg, data.n_features, data.n_labels, n_shards=2, pipeline=False,
        step_mode=step_mode,
    ) as trainer:  # fmt: skip
        history = trainer.train(data, Stream(32, seed=3))
        return history, trainer.shard_weights(), trainer.hidden_weights()


def test_graph_steps_give_the_actor_steps_weights(client, tiny):
    data = tiny[0].slice(0, 640)  # 20 steps of 32
    actor = _train(client, data, "actor")
    graph = _train(client, data, "graph")
    (actor_history, actor_shards, actor_hidden) = actor
    (graph_history, graph_shards, graph_hidden) = graph
    assert len(graph_history) == len(actor_history) == 20
    # Same calls on the same arrays; only the arrays' memory alignment after a network
    # hop may differ, and with it the last bit of a vectorised sum (see test_distributed).
    for (W, bias), (W_want, bias_want) in zip(graph_shards, actor_shards, strict=True):
        np.testing.assert_allclose(W, W_want, atol=1e-5)
        np.testing.assert_allclose(bias, bias_want, atol=1e-5)
    for got, want in zip(graph_hidden, actor_hidden, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    for got, want in zip(graph_history, actor_history, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        # the same activations and gradients cross the network
        assert (got["bytes_sent"], got["bytes_received"]) == (
            want["bytes_sent"], want["bytes_received"],
        )  # fmt: skip
        assert got["bytes_sent"] > 0


def test_the_performance_report_of_a_graph_run_names_the_phases(client, tiny, tmp_path):
    train, _ = tiny
    clf = SlideClassifier(**PARAMS, batch_size=32, client=client, step_mode="graph")
    report = tmp_path / "report.html"
    with performance_report(filename=str(report)):
        clf.fit(train.slice(0, 640).X, train.slice(0, 640).Y)  # 20 steps
    assert clf.n_steps_ == 20
    html = report.read_text()
    for phase in PHASES:  # in the task stream: one task per phase (and shard) and step
        steps = set(re.findall(rf'\["{phase}-[0-9a-f]{{8}}",(\d+)', html))
        assert steps == {str(s) for s in range(1, 21)}, phase

    def metrics(dask_scheduler):
        return list(dask_scheduler.cumulative_worker_metrics)

    # fine performance metrics: seconds of compute by phase
    timed = {k[1] for k in client.run_on_scheduler(metrics) if k[0] == "execute"}
    assert set(PHASES) <= timed
    losses = [h["loss"] for h in clf.history_]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])  # it learns


@pytest.mark.timeout(120)
def test_a_lost_worker_in_a_graph_step_raises_a_clear_error_not_a_hang(tiny):
    train, _ = tiny
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        DistributedTrainer(
            client, SlideConfig(**PARAMS), train.n_features, train.n_labels, step_mode="graph"
        ) as trainer,
    ):
        victim = trainer.placement.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]

        def kill_at_step_5(stats):
            if stats["step"] == 5:
                os.kill(pid, signal.SIGKILL)

        with pytest.raises(ShardLostError, match=r"lost shard 1 on tcp://.* the worker died"):
            trainer.train(train, Stream(32, epochs=3), kill_at_step_5)


def test_an_unknown_step_mode_is_refused(client, tiny):
    train, _ = tiny
    with pytest.raises(ValueError, match=r"step_mode must be one of \['actor', 'graph'\]"):
        DistributedTrainer(
            client, SlideConfig(**PARAMS), train.n_features, train.n_labels, step_mode="tasks"
        )

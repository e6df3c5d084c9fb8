"""Model-parallel training on a real LocalCluster (worker processes)."""

import os
import re
import signal
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, performance_report

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.data.stream import Stream
from dslide_dask.distributed import DistributedTrainer, ShardLostError, live_metrics
from dslide_dask.distributed.graph_step import PHASES
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.model.wire import payload_bytes

PARAMS = dict(hidden=(64,), K=3, L=20, range_pow=9, lr=1e-2, batch_size=128, seed=0)


@pytest.mark.parametrize("dropout", [0.0, pytest.param(0.3, marks=pytest.mark.slow)])
def test_one_shard_gives_the_same_weights_as_in_process(client, tiny, dropout):
    train, _ = tiny
    data = train.slice(0, 3200)  # 100 steps of 32
    params = {k: v for k, v in PARAMS.items() if k != "batch_size"}
    cfg = SlideConfig(**params, dropout=dropout)
    local = LocalTrainer(cfg, train.n_features, train.n_labels)
    local.train(data, Stream(32, seed=3))
    with DistributedTrainer(
        client,
        cfg,
        train.n_features,
        train.n_labels,
        n_shards=1,
        wire_dtype="float32",
        pipeline=False,
    ) as remote:
        history = remote.train(data, Stream(32, seed=3))
        assert len(history) == 100
        ((W, bias),) = remote.shard_weights()
        hidden = remote.hidden_weights()
    shard = local.network.shards[0]
    # Float tolerance: vectorised sums (numba, numpy's SIMD exp) may round differently
    # with the arrays' memory alignment, which differs for arrays that arrived over the
    # network; Adam carries such last-bit differences over 100 steps (up to ~1e-5 seen).
    # A wrong step would move weights by ~lr = 1e-2.
    tolerance = 1e-4
    np.testing.assert_allclose(W, shard.W, atol=tolerance)
    np.testing.assert_allclose(bias, shard.bias, atol=tolerance)
    for got, want in zip(hidden, local.network.hidden.params(), strict=True):
        np.testing.assert_allclose(got, want, atol=tolerance)
    assert np.abs(W - shard.W).mean() < 1e-6  # nearly every weight agrees to the last bits
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in local.history])


@pytest.mark.slow
@pytest.mark.parametrize("n_shards", [1, 2])
def test_sharded_training_learns_like_one_shard(client, tiny, n_shards):
    train, test = tiny
    clf = SlideClassifier(epochs=8, client=client, n_shards=n_shards, **PARAMS)
    clf.fit(train.X, train.Y)
    assert clf.trainer_.n_shards == n_shards
    local = SlideClassifier(epochs=8, client=False, **PARAMS).fit(train.X, train.Y)
    p1, p1_local = clf.score(test.X, test.Y), local.score(test.X, test.Y)
    live = live_metrics.snapshot(client)["runs"][clf.trainer_.name]  # the dashboard's view
    assert live["latest"]["step"] == clf.n_steps_
    assert len(live["shard_busy"]) == n_shards and min(live["shard_busy"]) > 0
    assert p1 > 0.3, p1
    assert abs(p1 - p1_local) < 0.08, (p1, p1_local)
    steps = clf.history_
    # only the shards on other workers than the coordinator's are reached over the network
    remote = n_shards - 1
    if remote:
        per_shard = steps[10]["bytes_sent"] / remote
        assert 128 * 64 * 2 < per_shard < 128 * 64 * 2 + 128 * 4 + 4096  # float16 h + labels
    else:
        assert steps[10]["bytes_sent"] == steps[10]["bytes_received"] == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("step_mode", ["actor", "graph"])  # graph: pinned tasks would wait
def test_a_lost_worker_raises_a_clear_error_not_a_hang(tiny, step_mode):
    train, _ = tiny
    cfg = SlideConfig(**{k: v for k, v in PARAMS.items() if k != "batch_size"})
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        DistributedTrainer(
            client, cfg, train.n_features, train.n_labels, step_mode=step_mode
        ) as trainer,
    ):
        victim = trainer.placement.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]

        def kill_at_step_5(stats):
            if stats["step"] == 5:
                os.kill(pid, signal.SIGKILL)

        with pytest.raises(ShardLostError, match=r"lost shard 1 on tcp://.* the worker died"):
            trainer.train(train, Stream(32, epochs=3), kill_at_step_5)


@pytest.mark.slow
def test_workers_stream_training_data_from_s3(client, tiny, s3):
    """The coordinator's worker reads the training files from a real S3 endpoint
    (moto's server on 127.0.0.1) by URL: the client only reads the headers."""
    from dslide_dask.data.xc_text import write_xc
    from tests.conftest import BUCKET

    train, test = tiny
    for i, part in enumerate((train.slice(0, 2500), train.slice(2500, 5000))):
        write_xc(f"s3://{BUCKET}/tiny/train-{i}.txt", part, storage_options=s3)
    from dslide_dask.data.batches import plan
    from dslide_dask.data.held import read_split

    url = f"s3://{BUCKET}/tiny/train-*.txt"
    clf = SlideClassifier(epochs=8, client=client, n_shards=2, **PARAMS)
    clf.fit(url, storage_options=s3)
    # every row but those held out to weigh the fused parts on, which a worker built
    kept, held = read_split(plan(url, s3), clf._held_rows)
    assert 0 < held.n_points < 0.1 * train.n_points
    assert sum(h["samples"] for h in clf.history_) == 8 * kept.n_points
    assert clf.score(test.X, test.Y) > 0.3


# -- graph step mode: steps as named tasks, equal to actor steps ---------------------------------
GRAPH_PARAMS = {k: v for k, v in PARAMS.items() if k != "batch_size"}


def _train(client, data, step_mode):
    cfg = SlideConfig(**GRAPH_PARAMS)
    with DistributedTrainer(
        client,
        cfg,
        data.n_features,
        data.n_labels,
        n_shards=2,
        pipeline=False,
        step_mode=step_mode,
    ) as trainer:
        history = trainer.train(data, Stream(32, seed=3))
        return history, trainer.shard_weights(), trainer.hidden_weights()


@pytest.mark.slow
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
            want["bytes_sent"],
            want["bytes_received"],
        )
        assert got["bytes_sent"] > 0


@pytest.mark.slow
def test_the_performance_report_of_a_graph_run_names_the_phases(client, tiny, tmp_path):
    train, _ = tiny
    clf = SlideClassifier(**GRAPH_PARAMS, batch_size=32, client=client, step_mode="graph")
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


def test_an_unknown_step_mode_is_refused(client, tiny):
    train, _ = tiny
    with pytest.raises(ValueError, match=r"step_mode must be one of \['actor', 'graph'\]"):
        DistributedTrainer(
            client, SlideConfig(**GRAPH_PARAMS), train.n_features, train.n_labels, step_mode="tasks"
        )


# -- the hidden layer split by units over the workers ---------------------------------------------
def _train_split(client, data, hidden_shards, pipeline, **kwargs):
    params = {k: v for k, v in PARAMS.items() if k != "batch_size"}
    trainer = DistributedTrainer(
        client,
        SlideConfig(**params),
        data.n_features,
        data.n_labels,
        n_shards=2,
        hidden_shards=hidden_shards,
        pipeline=pipeline,
        **kwargs,
    )
    history = trainer.train(data, Stream(32, seed=3))
    return trainer, history


@pytest.mark.parametrize(
    "pipeline",
    [pytest.param(False, marks=pytest.mark.slow), True],
    ids=["one phase at a time", "pipelined"],
)
def test_a_hidden_layer_split_over_workers_trains_as_the_whole_one(client, tiny, pipeline):
    """Each unit's arithmetic is its own: the layer split over 2 workers takes the steps
    the whole one takes (same initial weights, same updates, in the same order relative
    to the output layer's), at the cost of the batch's input and the units' activations
    and gradients crossing the network."""
    data = tiny[0].slice(0, 1600)  # 50 steps of 32
    whole, whole_history = _train_split(client, data, 1, pipeline)
    split, split_history = _train_split(client, data, 2, pipeline)
    try:
        assert whole.placement.hidden_units == ()
        assert split.placement.hidden_units == ((0, 32), (32, 64))
        for got, want in zip(split.hidden_weights(), whole.hidden_weights(), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-4)
            assert np.abs(got - want).mean() < 1e-6
        for (W, b), (W_want, b_want) in zip(
            split.shard_weights(), whole.shard_weights(), strict=True
        ):
            np.testing.assert_allclose(W, W_want, atol=1e-4)
            np.testing.assert_allclose(b, b_want, atol=1e-4)
        losses = [h["loss"] for h in split_history]
        assert losses == pytest.approx([h["loss"] for h in whole_history], rel=1e-4)
        # the extra traffic: each batch's input to the other worker, and its 32 of the 64
        # units' activations back and gradients out, as float32
        traffic = [h["bytes_sent"] + h["bytes_received"] for h in split_history]
        extra = sum(traffic) - sum(h["bytes_sent"] + h["bytes_received"] for h in whole_history)
        inputs = sum(payload_bytes(b.X) for *_, b in Stream(32, seed=3).batches(data))
        assert extra == inputs + len(split_history) * 2 * 32 * 32 * 4
        # waits that overlap (the next batch's units beside this one's output layer) once
        assert all(h["shard_wait_seconds"] <= h["seconds"] for h in split_history)
    finally:
        whole.close()
        split.close()


@pytest.mark.slow
def test_a_split_hidden_layer_checkpoints_and_restores_under_any_split(client, tiny, tmp_path):
    data = tiny[0].slice(0, 640)
    split, _ = _train_split(client, data, 2, False)
    try:
        url = split.save(str(tmp_path / "split"))
        want = split.hidden_weights()
    finally:
        split.close()
    params = {k: v for k, v in PARAMS.items() if k != "batch_size"}
    for hidden_shards in (1, 2):
        with DistributedTrainer(
            client,
            SlideConfig(**params),
            data.n_features,
            data.n_labels,
            n_shards=2,
            hidden_shards=hidden_shards,
            restore=url,
        ) as restored:
            assert len(restored.placement.hidden_units) == (0 if hidden_shards == 1 else 2)
            for got, expected in zip(restored.hidden_weights(), want, strict=True):
                np.testing.assert_array_equal(got, expected)
            assert restored.step == 20
            restored.train(data, Stream(32, seed=3))  # and trains on


# -- closing ---------------------------------------------------------------------------------------
def _model_parts_alive() -> int:
    """Shards and hidden stacks alive in this worker process (run on each worker)."""
    import gc

    from dslide_dask.model.hidden import HiddenLayers
    from dslide_dask.model.wide_shard import WideShard

    return sum(isinstance(o, WideShard | HiddenLayers) for o in gc.get_objects())


def _parts_left_after(client, tiny, hidden_shards, close: bool) -> tuple[dict, dict, dict]:
    """Each worker's model parts before a trainer is built, once it has trained (its
    workers), and after it is closed or dropped (waiting up to 5 s: a call's last
    references go with its reply), with the workers' garbage collector off, so nothing is
    left to it."""
    import gc

    client.run(gc.collect)  # earlier tests' garbage: not this model's parts
    client.run(gc.disable)
    try:
        before = client.run(_model_parts_alive)
        trainer, _ = _train_split(client, tiny[0].slice(0, 320), hidden_shards, True)
        built = client.run(_model_parts_alive)
        workers = trainer.placement.workers
        if close:
            trainer.close()
        del trainer
        if not close:
            gc.collect()  # the client's side: distributed's actor handles sit in cycles there
        deadline = time.monotonic() + 5
        while (alive := client.run(_model_parts_alive)) != before and time.monotonic() < deadline:
            time.sleep(0.05)
        return before, {w: built[w] for w in workers}, alive
    finally:
        client.run(gc.enable)


@pytest.mark.parametrize("hidden_shards", [1, 2], ids=["hidden on the coordinator", "split"])
def test_closing_a_trainer_frees_its_model_on_the_workers_at_once(client, tiny, hidden_shards):
    """``close`` frees the model on every worker before it returns (on a small worker, a
    second model built next would otherwise find no room), with the workers' collector
    off: nothing is left for a later collection."""
    before, built, alive = _parts_left_after(client, tiny, hidden_shards, close=True)
    assert all(built[w] > before[w] for w in built)
    assert alive == before


@pytest.mark.parametrize("hidden_shards", [1, 2], ids=["hidden on the coordinator", "split"])
def test_a_trainer_dropped_without_closing_frees_its_model_on_the_workers(
    client, tiny, hidden_shards
):
    """A notebook that builds a second trainer under the same name never closes the
    first. Once the client lets go of its actors, the workers free the model by reference
    counting alone: its hidden stack holds its methods weakly, so it is in no reference
    cycle that only a full collection (rare on a quiet worker) would break."""
    before, built, alive = _parts_left_after(client, tiny, hidden_shards, close=False)
    assert built != {w: before[w] for w in built}
    assert alive == before

"""Model-parallel training on a real LocalCluster (worker processes)."""

import os
import signal

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.data.stream import Stream
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.distributed import DistributedTrainer, ShardLostError, live_metrics
from dslide_dask.local_trainer import LocalTrainer

PARAMS = dict(hidden=(64,), K=3, L=20, range_pow=9, lr=1e-2, batch_size=128, seed=0)


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


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_one_shard_gives_the_same_weights_as_in_process(client, tiny, dropout):
    train, _ = tiny
    data = train.slice(0, 3200)  # 100 steps of 32
    params = {k: v for k, v in PARAMS.items() if k != "batch_size"}
    cfg = SlideConfig(**params, dropout=dropout)
    local = LocalTrainer(cfg, train.n_features, train.n_labels)
    local.train(data, Stream(32, seed=3))
    with DistributedTrainer(
        client, cfg, train.n_features, train.n_labels, n_shards=1,
        wire_dtype="float32", pipeline=False,
    ) as remote:  # fmt: skip
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


@pytest.mark.timeout(120)
def test_a_lost_worker_raises_a_clear_error_not_a_hang(tiny):
    train, _ = tiny
    cfg = SlideConfig(**{k: v for k, v in PARAMS.items() if k != "batch_size"})
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        DistributedTrainer(client, cfg, train.n_features, train.n_labels) as trainer,
    ):
        victim = trainer.placement.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]

        def kill_at_step_5(stats):
            if stats["step"] == 5:
                os.kill(pid, signal.SIGKILL)

        with pytest.raises(ShardLostError, match=r"lost shard 1 on tcp://.* the worker died"):
            trainer.train(train, Stream(32, epochs=3), kill_at_step_5)


def test_workers_stream_training_data_from_s3(client, tiny, s3):
    """The coordinator's worker reads the training files from a real S3 endpoint
    (moto's server on 127.0.0.1) by URL: the client only reads the headers."""
    from dslide_dask.data.xc_text import write_xc
    from tests.conftest import BUCKET

    train, test = tiny
    for i, part in enumerate((train.slice(0, 2500), train.slice(2500, 5000))):
        write_xc(f"s3://{BUCKET}/tiny/train-{i}.txt", part, storage_options=s3)
    clf = SlideClassifier(epochs=8, client=client, n_shards=2, **PARAMS)
    clf.fit(f"s3://{BUCKET}/tiny/train-*.txt", storage_options=s3)
    assert sum(h["samples"] for h in clf.history_) == 8 * train.n_points
    assert clf.score(test.X, test.Y) > 0.3

"""A worker counts as lost only on evidence (:mod:`dslide_dask.distributed.liveness`):
the scheduler removed it, or its heartbeat stood still for ``lost_after`` seconds. A slow
call, a failed query of the scheduler or the client's stale cache of the worker list is
none: on a loaded machine those declared both workers of a healthy run lost."""

from __future__ import annotations

import asyncio

import pytest
from distributed import Client, LocalCluster

from dslide_dask import SlideConfig
from dslide_dask.data.stream import Stream
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.distributed import DistributedTrainer, liveness
from dslide_dask.distributed.coordinator import Coordinator
from dslide_dask.distributed.errors import POLL_SECONDS
from dslide_dask.distributed.liveness import Liveness


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_query_is_no_evidence():
    live = Liveness(lost_after=60, clock=Clock())
    assert live.lost({"a", "b"}, None) == set()


def test_a_worker_the_scheduler_removed_is_lost():
    live = Liveness(lost_after=60, clock=Clock())
    assert live.lost({"a", "b"}, {"a": {"last_seen": 1.0}}) == {"b"}


def test_a_silent_worker_is_lost_only_after_lost_after():
    clock = Clock()
    live = Liveness(lost_after=60, clock=clock)
    listed = {"a": {"last_seen": 5.0}, "b": {"last_seen": 5.0}}
    assert live.lost({"a", "b"}, listed) == set()
    for t in range(10, 61, 10):  # a beats, b stands still: not yet 60 s
        clock.now = t
        listed["a"] = {"last_seen": 5.0 + t}
        assert live.lost({"a", "b"}, listed) == set()
    clock.now = 60.5
    assert live.lost({"a", "b"}, listed) == {"b"}
    listed["b"] = {"last_seen": 99.0}  # it answered again
    assert live.lost({"a", "b"}, listed) == set()


def test_no_heartbeat_record_is_no_evidence():
    clock = Clock()
    live = Liveness(lost_after=1, clock=clock)
    live.lost({"a"}, {"a": {}})
    clock.now = 1000
    assert live.lost({"a"}, {"a": {}}) == set()


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_lost_after_must_be_positive(bad):
    with pytest.raises(ValueError, match="lost_after must be a positive number"):
        Liveness(lost_after=bad)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slow_worker_with_a_stale_cache_is_not_lost(monkeypatch):
    """The first coordinator call takes 3 polls (an injected delay); meanwhile the
    client's cached worker list is the one its periodic refresh leaves (no workers) and
    the first fresh query fails. Before, the first poll read that cache and raised
    ``ShardLostError: lost shard 0 ..., shard 1 ... after 0 steps``; now the run ends."""
    train, _ = make_synthetic("tiny", seed=0)
    data = train.slice(0, 640)
    delayed = []
    real_run = Coordinator.run

    async def slow_run(self, n_steps):
        if not delayed:
            delayed.append(n_steps)
            await asyncio.sleep(3 * POLL_SECONDS)
        return await real_run(self, n_steps)

    failed = []
    real_listed = liveness.listed_workers

    def flaky(client, timeout=liveness.QUERY_SECONDS):
        if not failed:
            failed.append(True)
            return None  # the query timed out
        return real_listed(client, timeout)

    def stale_cache(self, n_workers=-1, **kwargs):
        return {"type": "Scheduler", "workers": {}}

    cfg = SlideConfig(hidden=(16,), K=2, L=4, range_pow=6)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as lc,
        Client(lc) as client,
        DistributedTrainer(client, cfg, train.n_features, train.n_labels) as trainer,
    ):
        monkeypatch.setattr(Coordinator, "run", slow_run)
        monkeypatch.setattr(liveness, "listed_workers", flaky)
        monkeypatch.setattr("dslide_dask.distributed.recovery.listed_workers", flaky)
        monkeypatch.setattr(Client, "scheduler_info", stale_cache)
        history = trainer.train(data, Stream(64, epochs=1))
        assert len(history) == 10
        assert delayed and failed
        assert trainer.recoveries == []

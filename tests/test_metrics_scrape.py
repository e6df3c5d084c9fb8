"""Monitoring a run does not change it: Dask's ``/metrics`` handler asks the scheduler for
``adaptive_target()``, which asks which workers could be closed (the scheduler plugin's
``valid_workers_downscaling``). That question must not start a hand-off; only a
retirement that really happens may (issue 53)."""

import threading
import urllib.request
from urllib.parse import urlsplit

import pytest
from distributed import Client, LocalCluster

from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.data.stream import Stream
from dslide_dask.distributed import DistributedTrainer
from dslide_dask.distributed.moves.policy import (
    ElasticPolicy,
    KeepShardWorkers,
    retire_requests,
)

from .test_resilience import BATCH, CFG

#: Scrapes at most this many times (a bound, should a run hang).
MAX_SCRAPES = 600


class Holder:
    """An actor, as a shard is to Dask: a worker holding one cannot be retired."""


def _plugin_state(dask_scheduler):
    plugin = dask_scheduler.plugins[KeepShardWorkers.name]
    return sorted(plugin.asked)


def _ask(dask_scheduler):
    """What Dask's ``/metrics``, ``/api/v1/adaptive_target`` and its scalers ask."""
    return dask_scheduler.adaptive_target(), dask_scheduler.workers_to_close(n=1)


def test_asking_which_workers_could_close_changes_nothing_a_refused_retirement_does():
    """Questions (``adaptive_target``, ``workers_to_close``, a ``/metrics`` scrape) never
    offer the worker holding an actor and never ask the run for a hand-off; a retirement
    Dask refuses does, and meanwhile no worker at all is offered to a scaler."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as client,
    ):
        client.wait_for_workers(2)
        client.register_plugin(KeepShardWorkers(), name=KeepShardWorkers.name)
        holding, free = sorted(client.scheduler_info()["workers"])
        actor = client.submit(Holder, actor=True, workers=[holding]).result()
        for _ in range(3):
            assert "dask_scheduler_desired_workers" in _scrape(_metrics(client))
            target, to_close = client.run_on_scheduler(_ask)
            assert to_close == [free]  # the holder is never offered
        assert client.run_on_scheduler(_plugin_state) == []
        assert retire_requests(client.get_events("all"), 0.0) == set()

        assert client.retire_workers([holding]) == {}  # refused: it holds an actor
        assert retire_requests(client.get_events("all"), 0.0) == {holding}
        assert client.run_on_scheduler(_plugin_state) == [holding]
        assert client.run_on_scheduler(_ask)[1] == []  # a hand-off under way: none
        del actor


def _metrics(client) -> str:
    """The dashboard's ``/metrics`` (it listens on 127.0.0.1 whatever host the link names)."""
    return f"http://127.0.0.1:{urlsplit(client.dashboard_link).port}/metrics"


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_scraped_at_metrics_every_second_keeps_its_workers(tiny, tmp_path):
    """A thread scrapes the dashboard's ``/metrics`` every second for the whole run, and
    the run itself scrapes once at step 5 (so at least one scrape precedes the step
    boundaries that read the scheduler's requests, however slow the machine): the same
    two workers hold the shards to the end, nothing moved, nothing was restored."""
    train, _ = tiny
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc) as client,
        DistributedTrainer(
            client,
            CFG,
            train.n_features,
            train.n_labels,
            checkpoint=CheckpointPolicy(str(tmp_path / "ckpt")),
            elastic=ElasticPolicy(),
        ) as trainer,
    ):
        url = _metrics(client)
        before = tuple(trainer.placement.workers)
        assert len(set(before)) == 2
        scraped: list[str] = []
        done = threading.Event()

        def scrape_every_second():
            while not done.is_set() and len(scraped) < MAX_SCRAPES:
                scraped.append(_scrape(url))
                done.wait(1.0)

        scraper = threading.Thread(target=scrape_every_second, daemon=True)
        scraper.start()

        def scrape_at_step_5(record):
            if record["step"] == 5:
                scraped.append(_scrape(url))

        try:
            history = trainer.train(train, Stream(BATCH, epochs=2), scrape_at_step_5)
        finally:
            done.set()
            scraper.join(timeout=60)
        assert not scraper.is_alive()
        assert len(scraped) >= 2
        assert all("dask_scheduler_desired_workers" in text for text in scraped)
        assert trainer.moves == []
        assert trainer.recoveries == []
        assert tuple(trainer.placement.workers) == before
        assert set(client.scheduler_info(n_workers=-1)["workers"]) == set(before)
        assert [r["step"] for r in history] == list(range(1, 81))

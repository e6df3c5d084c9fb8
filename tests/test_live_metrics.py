"""Live training metrics: published on a worker, served by the scheduler's web server."""

import json
import math
import re
import shutil
import subprocess
import time
import urllib.request
from urllib.parse import urlsplit

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_worker

from dslide_dask.distributed.live_metrics import (
    TOPIC,
    TrainingMetricsPlugin,
    exposition,
    install,
    publish,
    scheduler_routes,
    snapshot,
)

STEP = {
    "step": np.int64(7),
    "samples": 128,
    "loss": np.float32(2.5),
    "active": 600.0,
    "seconds": 0.25,
    "bytes_sent": 1000,
    "bytes_received": 3000,
    "coordinator_seconds": 0.05,
    "shard_wait_seconds": 0.15,
    "round_trips": 1,
    "shard_busy": np.array([0.5, 1.5]),
}
EVALUATION = {"step": 7, "P@1": 0.25, "P@3": 0.125, "P@5": 0.1}


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert install(client)
        assert install(client)  # idempotent: the same plugin keeps its state
        yield client


@pytest.fixture(scope="module")
def base(client):
    link = urlsplit(client.dashboard_link)
    return f"{link.scheme}://{link.netloc}"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


def wait_for(condition, timeout: float = 30.0):
    """Poll until ``condition()`` is truthy; return it."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, "timed out waiting for the metrics to arrive"
        time.sleep(0.1)
    return result


def run_of(base: str, name: str, when=lambda run: True) -> dict | None:
    run = json.loads(get(f"{base}/dslide/metrics.json"))["runs"].get(name)
    return run if run is not None and when(run) else None


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, labels in any order."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match[1] or "")) == labels:
            return float(match[2])
    return None


def publish_from_task(record: dict, run: str) -> None:
    publish(get_worker(), record, run=run)  # from a worker thread, as a threaded actor would


def test_step_and_evaluation_reach_the_json_route_and_prometheus_text(client, base):
    client.submit(publish_from_task, STEP, "run-a", pure=False).result()
    # and from the worker's event loop, as the (async) coordinator does
    client.run(lambda dask_worker: publish(dask_worker, EVALUATION, run="run-a"))
    run = wait_for(lambda: run_of(base, "run-a", lambda r: r["evaluation"]))
    latest = run["latest"]
    assert latest["step"] == 7 and latest["loss"] == 2.5 and latest["round_trips"] == 1
    assert latest["samples_per_second"] == 512.0 and latest["bytes_per_step"] == 4000.0
    assert run["evaluation"] == EVALUATION
    assert run["shard_busy"] == [0.5, 1.5]
    assert run["worker"] in client.scheduler_info()["workers"]
    assert [p["step"] for p in run["history"]] == [7]
    assert snapshot(client)["runs"]["run-a"]["latest"] == latest

    text = get(f"{base}/dslide/metrics")
    expected = {
        ("dslide_step", ()): 7.0,
        ("dslide_loss", ()): 2.5,
        ("dslide_samples_per_second", ()): 512.0,
        ("dslide_active_neurons_per_example", ()): 600.0,
        ("dslide_bytes_per_step", ()): 4000.0,
        ("dslide_shard_wait_seconds", ()): 0.15,
        ("dslide_samples_total", ()): 128.0,
        ("dslide_bytes_total", (("direction", "received"),)): 3000.0,
        ("dslide_precision_at_k", (("k", "1"),)): 0.25,
        ("dslide_precision_at_k", (("k", "5"),)): 0.1,
        ("dslide_evaluation_step", ()): 7.0,
        ("dslide_shard_busy_seconds_total", (("shard", "1"),)): 1.5,
    }
    for (name, labels), value in expected.items():
        assert sample(text, name, run="run-a", **dict(labels)) == value, name
    assert "# TYPE dslide_samples_total counter" in text
    assert "# TYPE dslide_shard_busy_seconds_total counter" in text


def test_the_schedulers_own_metrics_endpoint_carries_them(client, base):
    """Dask's ``/metrics`` needs prometheus_client on the scheduler (here: this process)."""
    pytest.importorskip("prometheus_client")
    client.run(lambda dask_worker: publish(dask_worker, {"step": 3, "loss": 1.25}, run="run-p"))

    def scraped():
        text = get(f"{base}/metrics")
        return text if 'run="run-p"' in text else None

    text = wait_for(scraped)
    assert sample(text, "dslide_loss", run="run-p") == 1.25
    assert sample(text, "dslide_step", run="run-p") == 3.0
    assert sample(text, "dask_scheduler_workers", state="idle") is not None  # Dask's still there


def test_the_page_is_served_and_listed_with_the_individual_plots(base):
    page = get(f"{base}/dslide")
    assert "<title>DSLIDE training</title>" in page and "metrics.json" in page
    assert get(f"{base}/dslide/") == page
    plots = json.loads(get(f"{base}/individual-plots.json"))
    assert plots["Individual DSLIDE Training"] == "/dslide"
    assert "Individual Task Stream" in plots  # Dask's own entries are kept


def test_bad_records_are_counted_not_raised_in_the_scheduler(client, base):
    before = snapshot(client)["rejected"]
    bad = [
        {"step": 1, "loss": "oops"},
        {"step": 1, "loss": math.nan},
        {"step": 1, "shard_busy": "busy"},
        {"step": 1, "loss": {"nested": 1.0}},
        {"step": 1},  # no metrics
    ]
    for record in bad:
        client.run(lambda dask_worker, record=record: publish(dask_worker, record, run="run-bad"))
    client.run(lambda dask_worker: dask_worker.log_event(TOPIC, "not a dict"))
    client.run(lambda dask_worker: dask_worker.log_event(TOPIC, {"run": 5, "loss": 1.0}))
    client.run(lambda dask_worker: publish(dask_worker, {"step": 2, "loss": 0.5}, run="run-ok"))
    wait_for(lambda: run_of(base, "run-ok"))  # events arrive in order: the bad ones are in
    held = snapshot(client)
    assert held["rejected"] - before == len(bad) + 2
    assert "run-bad" not in held["runs"]
    assert any("loss='oops' is not a finite number" in r for r in held["rejections"])
    text = get(f"{base}/dslide/metrics")
    assert sample(text, "dslide_rejected_records_total") == held["rejected"]
    assert client.submit(lambda: 1 + 1).result() == 2  # the scheduler carries on


def test_publish_never_raises():
    class Sink:
        def log_event(self, topic, msg):
            self.sent = (topic, msg)

    sink = Sink()
    assert publish(sink, {"step": np.int64(1), "loss": np.float32(0.5)}, run="r")
    assert sink.sent == (TOPIC, {"step": 1, "loss": 0.5, "run": "r"})
    assert not publish(object(), {"step": 1})  # no log_event
    assert not publish(None, {"step": 1})

    class Broken:
        def log_event(self, topic, msg):
            raise OSError("stream closed")

    assert not publish(Broken(), {"step": 1})


def test_history_is_thinned_over_the_whole_run_and_runs_are_kept_apart():
    plugin = TrainingMetricsPlugin(max_points=8, max_runs=2)
    for step in range(1, 101):
        plugin.log_event(TOPIC, {"run": "a", "step": step, "samples": 10, "seconds": 0.5})
    plugin.log_event(TOPIC, {"run": "b", "step": 1, "loss": 3.0})
    run = plugin.snapshot()["runs"]["a"]
    steps = [p["step"] for p in run["history"]]
    assert len(steps) <= 8 and steps[0] == 1 and steps[-1] >= 80  # spread, not the last 8
    assert run["totals"]["samples"] == 1000 and run["latest"]["samples_per_second"] == 20.0
    assert plugin.snapshot()["runs"]["b"]["latest"] == {"step": 1.0, "loss": 3.0}
    plugin.log_event(TOPIC, {"run": "c", "step": 1, "loss": 2.0})  # past max_runs: "a" goes
    assert sorted(plugin.runs) == ["b", "c"]
    plugin.log_event("another-topic", "ignored")
    assert plugin.rejected == 0


def test_exposition_escapes_label_values():
    plugin = TrainingMetricsPlugin()
    plugin.log_event(TOPIC, {"run": 'a"b\\c\nd', "step": 1, "loss": 2.0})
    text = exposition(plugin.families())
    assert 'dslide_loss{run="a\\"b\\\\c\\nd"} 2.0' in text.splitlines()
    assert "dslide_rejected_records_total 0.0" in text.splitlines()


@pytest.fixture(scope="module")
def configured():
    """A cluster whose scheduler starts with the routes in its configuration."""
    routes = {"distributed.scheduler.http.routes": scheduler_routes()}
    with (
        dask.config.set(routes),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        link = urlsplit(client.dashboard_link)
        yield client, f"{link.scheme}://{link.netloc}"


@pytest.mark.slow
def test_configured_routes_answer_empty_before_the_first_run(configured):
    client, base = configured
    assert snapshot(client) is None  # no plugin yet: nothing has trained
    assert get(f"{base}/dslide/metrics") == ""
    assert json.loads(get(f"{base}/dslide/metrics.json"))["runs"] == {}
    assert "<title>DSLIDE training</title>" in get(f"{base}/dslide")
    plots = json.loads(get(f"{base}/individual-plots.json"))
    assert plots["Individual DSLIDE Training"] == "/dslide" and "Individual Task Stream" in plots
    assert install(client)  # the plugin finds its routes served and adds none
    client.run(lambda dask_worker: publish(dask_worker, {"step": 1, "loss": 2.0}, run="early"))
    text = wait_for(lambda: (t := get(f"{base}/dslide/metrics")) and 'run="early"' in t and t)
    assert sample(text, "dslide_loss", run="early") == 2.0


def test_scheduler_routes_adds_the_module_once_ahead_of_dasks_listing():
    dasks = ["a", "distributed.http.scheduler.info", "b"]
    routes = scheduler_routes(dasks)
    assert routes == ["a", "dslide_dask.distributed.live_metrics.routes", *dasks[1:]]
    assert scheduler_routes(routes) == routes
    assert scheduler_routes(["a"])[-1] == "dslide_dask.distributed.live_metrics.routes"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_finds_both_endpoints_clean(client, base):
    client.run(lambda dask_worker: publish(dask_worker, {**STEP, **EVALUATION}, run="run-lint"))
    wait_for(lambda: 'run="run-lint"' in get(f"{base}/metrics"))
    for path in ("/dslide/metrics", "/metrics"):
        text = get(f"{base}{path}")
        assert 'run="run-lint"' in text
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert check.returncode == 0, (path, check.stdout, check.stderr)

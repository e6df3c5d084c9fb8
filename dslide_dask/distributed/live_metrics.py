"""Live training metrics where Dask users look: the dashboard and its Prometheus endpoint.

The coordinator calls :func:`publish` after each step and each evaluation: one
``Worker.log_event`` on the worker's batched stream to the scheduler, no round trip. On
the scheduler, :class:`TrainingMetricsPlugin` (put there by :func:`install`, or by
``dask scheduler --preload dslide_dask.distributed.live_metrics``) keeps the latest values
and a bounded history of every run, and serves them on the dashboard's web server:

- ``/dslide``: a page plotting them, refreshed every 2 s; it is also listed in
  ``/individual-plots.json``, so JupyterLab's Dask sidebar offers it;
- ``/dslide/metrics.json``: the same data as JSON;
- ``/dslide/metrics``: Prometheus text format, with nothing extra installed;
- ``/metrics``: the scheduler's own Prometheus endpoint carries the ``dslide_*`` families
  too when ``prometheus_client`` is installed on the scheduler (Dask's ``/metrics`` needs
  it anyway).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
from distributed import Client, Scheduler
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler

logger = logging.getLogger(__name__)

#: The event topic records travel on.
TOPIC = "dslide-metrics"
#: The plugin's name on the scheduler.
PLUGIN_NAME = "dslide-training-metrics"
#: Run name of records that name none.
DEFAULT_RUN = "default"
#: Runs kept; the least recently updated goes first.
MAX_RUNS = 16
#: History points kept per run, spread over the whole run.
MAX_POINTS = 1024
#: Steps over which samples/s is averaged.
RATE_WINDOW = 20
#: Step fields summed into counters.
TOTALS = ("samples", "seconds", "bytes_sent", "bytes_received")
#: Fields of the plotted training curve.
CURVE = ("step", "loss", "samples_per_second", "active", "bytes_per_step", "seconds")

#: Evaluation metrics (``P@1``, ``nDCG@5``, ``PSP@3``...) by their name before the ``@``.
_EVALUATION = re.compile(r"(P|nDCG|PSP|PSnDCG)@(\d+)")


def _at_k(name: str):
    """The values of one evaluation metric of a run, labelled by k, for Prometheus."""

    def values(run) -> list[tuple[dict, float]]:
        found = ((_EVALUATION.fullmatch(k), v) for k, v in run.evaluation.items())
        return [({"k": m.group(2)}, v) for m, v in found if m and m.group(1) == name]

    return values


# -- the coordinator's side -----------------------------------------------------------------
def publish(target: Any, record: Mapping[str, Any], run: str | None = None) -> None:
    """Send one metrics record to the scheduler's plugin without waiting for it.

    ``target`` is the Worker the caller runs on (``get_worker()``, an actor's worker), or a
    Client (a round trip then). ``record`` holds numbers (numpy scalars and arrays are
    fine): a step's statistics, and/or the ``"P@k"`` (``"nDCG@k"``, ``"PSP@k"``...) values
    of an evaluation with its ``"step"``, optionally ``"shard_busy"`` (busy seconds of
    each shard) and ``"run"`` (a name; default ``"default"``). Never raises: metrics must
    not stop training."""
    try:
        msg = {str(k): _plain(v) for k, v in record.items()}
        if run is not None:
            msg["run"] = run
        target.log_event(TOPIC, msg)
    except Exception:
        logger.debug("dslide metrics record not sent", exc_info=True)


def _plain(value: Any) -> Any:
    """``value`` as the plain types a Dask event may carry (msgpack)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, np.ndarray | list | tuple):
        return [_plain(v) for v in value]
    return repr(value)


# -- the client's side ----------------------------------------------------------------------
def install(client: Client) -> bool:
    """Put the plugin on the client's scheduler (idempotent). False, with a warning, when
    the scheduler cannot take it (e.g. dslide_dask is not installed there)."""
    try:
        client.register_plugin(TrainingMetricsPlugin())
        return True
    except Exception as error:
        warnings.warn(f"dslide live metrics are off: {error!r}", RuntimeWarning, stacklevel=2)
        return False


def snapshot(client: Client) -> dict | None:
    """What the scheduler's plugin holds (as served at ``/dslide/metrics.json``), or None
    when it is not installed."""
    return client.run_on_scheduler(_snapshot_on_scheduler)


def _snapshot_on_scheduler(dask_scheduler: Scheduler) -> dict | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin.snapshot() if isinstance(plugin, TrainingMetricsPlugin) else None


def dask_setup(scheduler: Scheduler) -> None:
    """Preload hook: ``dask scheduler --preload dslide_dask.distributed.live_metrics``."""
    scheduler.add_plugin(TrainingMetricsPlugin(), idempotent=True)


# -- the scheduler's side -------------------------------------------------------------------
class _Thinned:
    """At most ``size`` points spread over a whole run: when full, every other point goes
    and from then on only every second (fourth, ...) new point is kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.points: list[dict[str, float]] = []
        self.stride = 1
        self.seen = 0

    def add(self, point: dict[str, float]) -> None:
        if self.seen % self.stride == 0:
            self.points.append(point)
            if len(self.points) > self.size:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1


class _Run:
    """Latest values, totals and history of one training run."""

    def __init__(self, max_points: int) -> None:
        self.worker = ""
        self.updated = 0.0
        self.latest: dict[str, float] = {}
        self.evaluation: dict[str, float] = {}
        self.shard_busy: list[float] = []
        self.totals = dict.fromkeys(TOTALS, 0.0)
        self.window: deque[tuple[float, float]] = deque(maxlen=RATE_WINDOW)
        self.curve = _Thinned(max_points)
        self.evaluations = _Thinned(max_points)

    def add_step(self, values: dict[str, float]) -> None:
        for key in TOTALS:
            self.totals[key] += values.get(key, 0.0)
        if "samples" in values and "seconds" in values:
            self.window.append((values["samples"], values["seconds"]))
        seconds = sum(s for _, s in self.window)
        if seconds > 0:
            values["samples_per_second"] = sum(n for n, _ in self.window) / seconds
        if "bytes_sent" in values or "bytes_received" in values:
            moved = values.get("bytes_sent", 0.0) + values.get("bytes_received", 0.0)
            values["bytes_per_step"] = moved
        self.latest = values
        self.curve.add({k: values[k] for k in CURVE if k in values} | {"time": self.updated})

    def add_evaluation(self, values: dict[str, float]) -> None:
        self.evaluation = values
        self.evaluations.add(values | {"time": self.updated})

    def summary(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "updated": self.updated,
            "latest": self.latest,
            "evaluation": self.evaluation,
            "shard_busy": self.shard_busy,
            "totals": self.totals,
            "history": self.curve.points,
            "evaluations": self.evaluations.points,
        }


class Family(NamedTuple):
    """One Prometheus metric family: ``kind`` is "gauge" or "counter"."""

    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]]


def _latest(field: str) -> Callable[[_Run], list[tuple[dict, float]]]:
    return lambda run: [({}, run.latest[field])] if field in run.latest else []


#: (name, kind, help, labels and value of each sample of a run) of the per-run families.
_FAMILIES = (
    ("dslide_step", "gauge", "Training steps taken", _latest("step")),
    ("dslide_loss", "gauge", "Training loss of the last step", _latest("loss")),
    ("dslide_step_seconds", "gauge", "Wall time of the last step", _latest("seconds")),
    ("dslide_samples_per_second", "gauge", f"Samples per second over the last {RATE_WINDOW} "
     "steps", _latest("samples_per_second")),
    ("dslide_active_neurons_per_example", "gauge", "Output neurons computed per example in "
     "the last step", _latest("active")),
    ("dslide_bytes_per_step", "gauge", "Bytes the coordinator sent plus received in the last "
     "step", _latest("bytes_per_step")),
    ("dslide_coordinator_seconds", "gauge", "Coordinator compute time in the last step",
     _latest("coordinator_seconds")),
    ("dslide_shard_wait_seconds", "gauge", "Time the coordinator waited for the shards in the "
     "last step", _latest("shard_wait_seconds")),
    ("dslide_last_update_timestamp_seconds", "gauge", "Unix time of the run's last record",
     lambda run: [({}, run.updated)]),
    ("dslide_samples_total", "counter", "Training samples processed",
     lambda run: [({}, run.totals["samples"])]),
    ("dslide_train_seconds_total", "counter", "Wall time spent in training steps",
     lambda run: [({}, run.totals["seconds"])]),
    ("dslide_bytes_total", "counter", "Bytes the coordinator sent or received",
     lambda run: [({"direction": d}, run.totals[f"bytes_{d}"]) for d in ("sent", "received")]),
    ("dslide_precision_at_k", "gauge", "P@k of the last evaluation", _at_k("P")),
    ("dslide_ndcg_at_k", "gauge", "nDCG@k of the last evaluation", _at_k("nDCG")),
    ("dslide_psp_at_k", "gauge", "Propensity-scored P@k of the last evaluation",
     _at_k("PSP")),
    ("dslide_psndcg_at_k", "gauge", "Propensity-scored nDCG@k of the last evaluation",
     _at_k("PSnDCG")),
    ("dslide_evaluation_step", "gauge", "Step of the last evaluation",
     lambda run: [({}, run.evaluation["step"])] if "step" in run.evaluation else []),
    ("dslide_shard_busy_seconds", "gauge", "Busy seconds of each shard",
     lambda run: [({"shard": str(s)}, b) for s, b in enumerate(run.shard_busy)]),
)  # fmt: skip
_REJECTED = "Metrics records the scheduler rejected (not a dict, a value not a finite number...)"


class TrainingMetricsPlugin(SchedulerPlugin):
    """Collects the records of :func:`publish` on the scheduler and serves them over HTTP.

    Bad records (not a dict, a value that is not a finite number...) are counted and
    logged, never raised into the scheduler."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, max_points: int = MAX_POINTS, max_runs: int = MAX_RUNS) -> None:
        self.max_points = max_points
        self.max_runs = max_runs
        self.runs: dict[str, _Run] = {}
        self.rejected = 0
        self.rejections: deque[str] = deque(maxlen=10)

    async def start(self, scheduler: Scheduler) -> None:
        _add_routes(scheduler)
        _LIVE.add(self)
        _register_prometheus_collector()

    async def close(self) -> None:
        _LIVE.discard(self)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC:
            return
        try:
            self.add(msg)
        except (TypeError, ValueError) as error:
            self.rejected += 1
            self.rejections.append(str(error)[:300])
            if self.rejected & (self.rejected - 1) == 0:  # the 1st, 2nd, 4th, 8th...
                logger.warning("dslide metrics: rejected record %d: %s", self.rejected, error)

    def add(self, msg: Any) -> None:
        """Take one record; TypeError or ValueError, and nothing kept, if it is bad."""
        if not isinstance(msg, dict):
            raise TypeError(f"record is a {type(msg).__name__}, not a dict")
        name = msg.get("run", DEFAULT_RUN)
        if not isinstance(name, str) or not name:
            raise TypeError(f"run {name!r} is not a non-empty string")
        values, busy = {}, None
        for key, value in msg.items():
            if key in ("run", "worker"):
                continue
            if key == "shard_busy":  # a list, which msgpack delivers as a tuple
                if not isinstance(value, list | tuple):
                    raise TypeError(f"shard_busy={value!r} is not a list")
                busy = [_number(key, v) for v in value]
            else:
                values[key] = _number(key, value)
        precision = {k: v for k, v in values.items() if _EVALUATION.fullmatch(k)}
        step = {k: v for k, v in values.items() if k not in precision}
        if not precision and busy is None and not (step.keys() - {"step"}):
            raise ValueError(f"record has no metrics: {sorted(msg)}")
        run = self._run(name)
        run.worker = str(msg.get("worker", run.worker))
        run.updated = time.time()
        if step.keys() - {"step"}:
            run.add_step(step)
        if precision:
            run.add_evaluation(precision | ({"step": step["step"]} if "step" in step else {}))
        if busy is not None:
            run.shard_busy = busy

    def _run(self, name: str) -> _Run:
        if name not in self.runs:
            if len(self.runs) >= self.max_runs:
                del self.runs[min(self.runs, key=lambda r: self.runs[r].updated)]
            self.runs[name] = _Run(self.max_points)
        return self.runs[name]

    def snapshot(self) -> dict[str, Any]:
        """Everything held, JSON-ready."""
        return {
            "runs": {name: run.summary() for name, run in self.runs.items()},
            "rejected": self.rejected,
            "rejections": list(self.rejections),
        }

    def families(self) -> list[Family]:
        """The Prometheus metric families of every run."""
        out = [
            Family(name, kind, text, [({"run": r} | labels, value) for r, run in self.runs.items()
                                      for labels, value in samples(run)])
            for name, kind, text, samples in _FAMILIES
        ]  # fmt: skip
        rejected = [({}, float(self.rejected))]
        out.append(Family("dslide_rejected_records_total", "counter", _REJECTED, rejected))
        return out


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key}={value!r} is not a finite number")
    return float(value)


# -- Prometheus -----------------------------------------------------------------------------
def exposition(families: list[Family]) -> str:
    """Prometheus text format (version 0.0.4) of ``families`` that have samples."""
    lines = []
    for family in filter(lambda f: f.samples, families):
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        for labels, value in family.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{family.name}{{{text}}} {value!r}" if text else f"{family.name} {value!r}"
            )
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


#: Plugins started in this process (normally one: this scheduler's).
_LIVE: weakref.WeakSet[TrainingMetricsPlugin] = weakref.WeakSet()


class _Collector:
    """A prometheus_client collector of every live plugin's families."""

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        merged: dict[str, Family] = {}
        for plugin in list(_LIVE):
            for family in plugin.families():
                merged.setdefault(family.name, family._replace(samples=[]))
                merged[family.name].samples.extend(family.samples)
        for family in merged.values():
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            labels = list(family.samples[0][0]) if family.samples else []
            metric = kind(family.name, family.help, labels=labels)
            for sample_labels, value in family.samples:
                metric.add_metric([sample_labels[k] for k in labels], value)
            yield metric


_COLLECTOR: _Collector | None = None


def _register_prometheus_collector() -> None:
    """Add the dslide families to the scheduler's ``/metrics`` if prometheus_client is
    installed (once per process: its registry is global)."""
    global _COLLECTOR
    if _COLLECTOR is not None:
        return
    try:
        import prometheus_client
    except ImportError:
        return
    _COLLECTOR = _Collector()
    prometheus_client.REGISTRY.register(_COLLECTOR)


# -- the dashboard's web server -------------------------------------------------------------
class _Handler(RequestHandler):
    def plugin(self) -> TrainingMetricsPlugin | None:
        plugin = self.server.plugins.get(PLUGIN_NAME)
        return plugin if isinstance(plugin, TrainingMetricsPlugin) else None

    def reply(self, body: str, content_type: str) -> None:
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-store")
        self.write(body)


class _JSONHandler(_Handler):
    def get(self) -> None:
        plugin = self.plugin()
        data = plugin.snapshot() if plugin else {"runs": {}, "installed": False}
        self.reply(json.dumps(data), "application/json")


class _PrometheusHandler(_Handler):
    def get(self) -> None:
        plugin = self.plugin()
        self.reply(exposition(plugin.families() if plugin else []), "text/plain; version=0.0.4")


class _PageHandler(_Handler):
    def get(self) -> None:
        self.reply(_PAGE, "text/html; charset=utf-8")


def _individual_plots_handler() -> type | None:
    """Dask's ``/individual-plots.json`` (the plots JupyterLab's Dask sidebar lists) with
    the dslide page added, or None if this distributed version has no such handler."""
    try:
        from distributed.http.scheduler.info import IndividualPlots
    except ImportError:
        return None

    class WithDslide(IndividualPlots):
        def write(self, chunk: Any) -> None:
            if isinstance(chunk, dict):
                chunk = {**chunk, "Individual DSLIDE Training": "/dslide"}
            super().write(chunk)

    return WithDslide


def _add_routes(scheduler: Scheduler) -> None:
    """Add the dslide routes to the scheduler's web server (once; they find the plugin
    at each request). Routes added later take precedence over Dask's own."""
    app = getattr(scheduler, "http_application", None)
    if app is None or getattr(app, "_dslide_routes", False):
        return
    prefix = _http_prefix(app)
    kwargs = {"dask_server": scheduler}
    routes = [
        (rf"{prefix}dslide/?", _PageHandler, kwargs),
        (rf"{prefix}dslide/metrics\.json", _JSONHandler, kwargs),
        (rf"{prefix}dslide/metrics", _PrometheusHandler, kwargs),
    ]
    listing = _individual_plots_handler()
    if listing is not None:
        routes.append((rf"{prefix}individual-plots\.json", listing, kwargs))
    app.add_handlers(r".*", routes)
    app._dslide_routes = True


def _http_prefix(app: Any) -> str:
    """The dashboard's URL prefix ("/" unless ``--dashboard-prefix``), read off the route
    of Dask's ``/health`` (the Scheduler does not keep it)."""
    for rule in getattr(app.wildcard_router, "rules", []):
        pattern = getattr(getattr(rule.matcher, "regex", None), "pattern", "")
        if pattern.endswith("health$"):
            return pattern[: -len("health$")] or "/"
    return "/"


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>DSLIDE training</title>
<style>
body{font-family:sans-serif;margin:12px;color:#222}
h2 small,.note{color:#777;font-weight:normal;font-size:13px}
.charts{display:flex;flex-wrap:wrap;gap:10px;margin:6px 0 18px}
.chart{border:1px solid #ddd;padding:4px 6px}
.chart h4{margin:0 0 2px;font-size:12px;font-weight:normal}
polyline{fill:none;stroke:#1f77b4;stroke-width:1.5}
rect{fill:#ff7f0e}
</style></head>
<body>
<h2>DSLIDE training <small id="status"></small></h2>
<div id="runs" class="note">Waiting for metrics: train with a client of this cluster.</div>
<script>
const base = location.pathname.replace(/\\/?$/, "/");
const CHARTS = [["loss", "loss"], ["samples_per_second", "samples/s"],
  ["active", "active neurons / example"], ["bytes_per_step", "bytes / step"]];
const esc = s => String(s).replace(/[&<>"]/g, c => "&#" + c.charCodeAt(0) + ";");
const fmt = v => v === undefined ? "-" : Math.abs(v) >= 1e5 || (v && Math.abs(v) < 1e-3)
  ? v.toExponential(2) : String(+v.toPrecision(4));
const note = (x, y, text, anchor) =>
  `<text x="${x}" y="${y}" font-size="10" fill="#777" text-anchor="${anchor}">${text}</text>`;

function chart(points, key, label) {
  const pts = points.filter(p => p[key] !== undefined);
  const w = 300, h = 110, last = pts.length ? pts[pts.length - 1][key] : undefined;
  let line = "";
  if (pts.length > 1) {
    const xs = pts.map(p => p.step), ys = pts.map(p => p[key]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = x => 4 + (w - 8) * (x - x0) / ((x1 - x0) || 1);
    const sy = y => h - 16 - (h - 32) * (y - y0) / ((y1 - y0) || 1);
    line = `<polyline points="${pts.map(p => sx(p.step) + "," + sy(p[key])).join(" ")}"/>` +
      note(w - 4, 10, `${fmt(y0)} to ${fmt(y1)}`, "end") +
      note(4, h - 3, "step " + fmt(x0), "start") + note(w - 4, h - 3, fmt(x1), "end");
  }
  return `<div class="chart"><h4>${esc(label)}: <b>${fmt(last)}</b></h4>` +
    `<svg width="${w}" height="${h}">${line}</svg></div>`;
}

function bars(values) {
  if (!values.length) return "";
  const w = 300, h = 110, top = Math.max(...values) || 1, bw = (w - 8) / values.length;
  const rects = values.map((v, i) => `<rect x="${4 + i * bw}" y="${h - 4 - (h - 8) * v / top}"` +
    ` width="${Math.max(bw - 2, 1)}" height="${(h - 8) * v / top}"><title>shard ${i}: ` +
    `${fmt(v)} s</title></rect>`).join("");
  return `<div class="chart"><h4>busy seconds per shard (max <b>${fmt(top)}</b>)</h4>` +
    `<svg width="${w}" height="${h}">${rects}</svg></div>`;
}

function render(data) {
  const names = Object.keys(data.runs || {});
  if (!names.length) return;
  document.getElementById("runs").innerHTML = names.map(name => {
    const run = data.runs[name], latest = run.latest, ev = run.evaluation;
    const pk = Object.keys(ev).filter(k => k.startsWith("P@"))
      .map(k => `${esc(k)} <b>${fmt(ev[k])}</b>`).join(", ");
    return `<h3>${esc(name)} <span class="note">step ${fmt(latest.step)}, ` +
      `${fmt(run.totals.samples)} samples, on ${esc(run.worker)}</span></h3>` +
      `<div class="note">last evaluation${ev.step !== undefined ? " (step " + fmt(ev.step) +
      ")" : ""}: ${pk || "none yet"}; rejected records: ${data.rejected}</div>` +
      `<div class="charts">${CHARTS.map(([k, l]) => chart(run.history, k, l)).join("")}` +
      `${chart(run.evaluations, "P@1", "P@1")}${bars(run.shard_busy)}</div>`;
  }).join("");
}

async function refresh() {
  const status = document.getElementById("status");
  let data;
  try {
    data = await (await fetch(base + "metrics.json", {cache: "no-store"})).json();
  } catch (e) {
    status.textContent = "scheduler unreachable";
    return;
  }
  render(data);
  status.textContent = "updated " + new Date().toLocaleTimeString();
}
refresh();
setInterval(refresh, 2000);
</script>
</body></html>
"""

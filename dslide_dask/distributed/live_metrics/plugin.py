"""The scheduler's side: a plugin that collects the records and holds them per run."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any

from distributed import Scheduler
from distributed.diagnostics.plugin import SchedulerPlugin

from dslide_dask.distributed.live_metrics import prometheus, routes
from dslide_dask.distributed.live_metrics.events import DEFAULT_RUN, PLUGIN_NAME, TOPIC
from dslide_dask.distributed.live_metrics.runs import Run

logger = logging.getLogger(__name__)

#: Runs kept; the least recently updated goes first.
MAX_RUNS = 16
#: History points kept per run, spread over the whole run.
MAX_POINTS = 1024


class TrainingMetricsPlugin(SchedulerPlugin):
    """Collects the records of :func:`~.events.publish` on the scheduler; the dashboard's
    ``/dslide`` routes and Dask's ``/metrics`` serve what it holds.

    Bad records (not a dict, a value that is not a finite number...) are counted and
    logged, never raised into the scheduler."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, max_points: int = MAX_POINTS, max_runs: int = MAX_RUNS) -> None:
        self.max_points = max_points
        self.max_runs = max_runs
        self.runs: dict[str, Run] = {}
        self.rejected = 0
        self.rejections: deque[str] = deque(maxlen=10)

    async def start(self, scheduler: Scheduler) -> None:
        routes.serve(scheduler)
        registered = prometheus.collector()
        if registered is not None:
            registered.sources.add(self)

    async def close(self) -> None:
        registered = prometheus.collector()
        if registered is not None:
            registered.sources.discard(self)

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
        precision = {k: v for k, v in values.items() if prometheus.EVALUATION.fullmatch(k)}
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

    def _run(self, name: str) -> Run:
        if name not in self.runs:
            if len(self.runs) >= self.max_runs:
                del self.runs[min(self.runs, key=lambda r: self.runs[r].updated)]
            self.runs[name] = Run(self.max_points)
        return self.runs[name]

    def snapshot(self) -> dict[str, Any]:
        """Everything held, JSON-ready."""
        return {
            "runs": {name: run.summary() for name, run in self.runs.items()},
            "rejected": self.rejected,
            "rejections": list(self.rejections),
        }

    def families(self) -> list[prometheus.Family]:
        """The Prometheus metric families of every run."""
        return prometheus.families(self.runs, self.rejected)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key}={value!r} is not a finite number")
    return float(value)

"""What the scheduler keeps of each run: latest values, totals, a thinned history."""

from __future__ import annotations

from collections import deque
from typing import Any

#: Steps over which samples/s is averaged.
RATE_WINDOW = 20
#: Step fields summed into counters.
TOTALS = ("samples", "seconds", "bytes_sent", "bytes_received")
#: Fields of the plotted training curve.
CURVE = ("step", "loss", "samples_per_second", "active", "bytes_per_step", "seconds")


class Thinned:
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


class Run:
    """Latest values, totals and history of one training run."""

    def __init__(self, max_points: int) -> None:
        self.worker = ""
        self.updated = 0.0
        self.latest: dict[str, float] = {}
        self.evaluation: dict[str, float] = {}
        self.shard_busy: list[float] = []
        self.totals = dict.fromkeys(TOTALS, 0.0)
        self.window: deque[tuple[float, float]] = deque(maxlen=RATE_WINDOW)
        self.curve = Thinned(max_points)
        self.evaluations = Thinned(max_points)

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

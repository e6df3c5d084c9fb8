"""The runs' numbers as Prometheus metric families, in text format and for
``prometheus_client`` (which puts them on Dask's own ``/metrics``).

Gauges hold the latest value of a run; what only grows (samples, seconds, bytes, each
shard's busy time) is a counter named ``..._total``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from dslide_dask.distributed.live_metrics.runs import RATE_WINDOW, Run

#: Evaluation metrics (``P@1``, ``nDCG@5``, ``PSP@3``...) by their name before the ``@``.
EVALUATION = re.compile(r"(P|nDCG|PSP|PSnDCG)@(\d+)")

Samples = list[tuple[dict[str, str], float]]


class Family(NamedTuple):
    """One Prometheus metric family: ``kind`` is "gauge" or "counter"."""

    name: str
    kind: str
    help: str
    samples: Samples


def _latest(field: str) -> Callable[[Run], Samples]:
    return lambda run: [({}, run.latest[field])] if field in run.latest else []


def _total(field: str) -> Callable[[Run], Samples]:
    return lambda run: [({}, run.totals[field])]


def _at_k(name: str) -> Callable[[Run], Samples]:
    """The values of one evaluation metric of a run, labelled by k."""

    def values(run: Run) -> Samples:
        found = ((EVALUATION.fullmatch(k), v) for k, v in run.evaluation.items())
        return [({"k": m.group(2)}, v) for m, v in found if m and m.group(1) == name]

    return values


def _evaluation_step(run: Run) -> Samples:
    return [({}, run.evaluation["step"])] if "step" in run.evaluation else []


def _bytes(run: Run) -> Samples:
    return [({"direction": d}, run.totals[f"bytes_{d}"]) for d in ("sent", "received")]


def _shard_busy(run: Run) -> Samples:
    return [({"shard": str(s)}, b) for s, b in enumerate(run.shard_busy)]


GAUGE, COUNTER = "gauge", "counter"

#: (name, kind, help, the samples of a run) of the per-run families.
PER_RUN: tuple[tuple[str, str, str, Callable[[Run], Samples]], ...] = (
    ("dslide_step", GAUGE, "Training steps taken", _latest("step")),
    ("dslide_loss", GAUGE, "Training loss of the last step", _latest("loss")),
    ("dslide_step_seconds", GAUGE, "Wall time of the last step", _latest("seconds")),
    (
        "dslide_samples_per_second",
        GAUGE,
        f"Samples per second over the last {RATE_WINDOW} steps",
        _latest("samples_per_second"),
    ),
    (
        "dslide_active_neurons_per_example",
        GAUGE,
        "Output neurons computed per example in the last step",
        _latest("active"),
    ),
    (
        "dslide_bytes_per_step",
        GAUGE,
        "Bytes the coordinator sent plus received in the last step",
        _latest("bytes_per_step"),
    ),
    (
        "dslide_coordinator_seconds",
        GAUGE,
        "Coordinator compute time in the last step",
        _latest("coordinator_seconds"),
    ),
    (
        "dslide_shard_wait_seconds",
        GAUGE,
        "Time the coordinator waited for the shards in the last step",
        _latest("shard_wait_seconds"),
    ),
    (
        "dslide_last_update_timestamp_seconds",
        GAUGE,
        "Unix time of the run's last record",
        lambda run: [({}, run.updated)],
    ),
    ("dslide_samples_total", COUNTER, "Training samples processed", _total("samples")),
    ("dslide_train_seconds_total", COUNTER, "Wall time spent in training steps", _total("seconds")),
    ("dslide_bytes_total", COUNTER, "Bytes the coordinator sent or received", _bytes),
    ("dslide_precision_at_k", GAUGE, "P@k of the last evaluation", _at_k("P")),
    ("dslide_ndcg_at_k", GAUGE, "nDCG@k of the last evaluation", _at_k("nDCG")),
    ("dslide_psp_at_k", GAUGE, "Propensity-scored P@k of the last evaluation", _at_k("PSP")),
    (
        "dslide_psndcg_at_k",
        GAUGE,
        "Propensity-scored nDCG@k of the last evaluation",
        _at_k("PSnDCG"),
    ),
    ("dslide_evaluation_step", GAUGE, "Step of the last evaluation", _evaluation_step),
    ("dslide_shard_busy_seconds_total", COUNTER, "Busy seconds of each shard", _shard_busy),
)
REJECTED = "Metrics records the scheduler rejected (not a dict, a value not a finite number...)"


def families(runs: dict[str, Run], rejected: int) -> list[Family]:
    """The metric families of every run, labelled by ``run``, and the rejection count."""
    out = [
        Family(
            name,
            kind,
            text,
            [({"run": r} | labels, value) for r, run in runs.items() for labels, value in of(run)],
        )
        for name, kind, text, of in PER_RUN
    ]
    out.append(Family("dslide_rejected_records_total", COUNTER, REJECTED, [({}, float(rejected))]))
    return out


def exposition(families: Iterable[Family]) -> str:
    """Prometheus text format (version 0.0.4) of ``families`` that have samples ("" when
    none has)."""
    lines = []
    for family in filter(lambda f: f.samples, families):
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        for labels, value in family.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{family.name}{{{text}}} {value!r}" if text else f"{family.name} {value!r}"
            )
    return "\n".join(lines) + "\n" if lines else ""


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


class Collector:
    """A prometheus_client collector of the families of every live source (normally one:
    this scheduler's plugin)."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        merged: dict[str, Family] = {}
        for source in list(self.sources):
            for family in source.families():
                merged.setdefault(family.name, family._replace(samples=[]))
                merged[family.name].samples.extend(family.samples)
        for family in merged.values():
            kind = CounterMetricFamily if family.kind == COUNTER else GaugeMetricFamily
            labels = list(family.samples[0][0]) if family.samples else []
            metric = kind(family.name, family.help, labels=labels)
            for sample_labels, value in family.samples:
                metric.add_metric([sample_labels[k] for k in labels], value)
            yield metric


_COLLECTOR: Collector | None = None


def collector() -> Collector | None:
    """The process's collector, registered with prometheus_client's global registry on
    first use (Dask's ``/metrics`` serves that registry); None without prometheus_client."""
    global _COLLECTOR
    if _COLLECTOR is None:
        try:
            import prometheus_client
        except ImportError:
            return None
        _COLLECTOR = Collector()
        prometheus_client.REGISTRY.register(_COLLECTOR)
    return _COLLECTOR

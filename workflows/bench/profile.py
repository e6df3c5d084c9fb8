"""``dslide bench profile``: where a training step's time goes, phase by phase.

Trains a network in this process on a synthetic preset or XC text (``--train``), warms
the kernels up, then times the phases of each step: the engine's kernels are wrapped
for the run (their modules' attributes replaced by timed calls), and each phase is
charged only its own time (a table rebuild hashes rows, and that is charged to hashing).
Figures are per step, as shares of the step, and per active neuron (an example's labels,
retrieved neurons and random negatives), in nanoseconds and in cycles of the clock the
CPU reports. Time it on a quiet machine: the load of other processes lands in every
phase.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dslide_workflows.args import positive_int
from dslide_workflows.bench.contender import PRESET_POINTS
from dslide_workflows.bench.data import bench_data, check_data_args, load_datasets
from dslide_workflows.bench.engine import add_engine_opt
from dslide_workflows.bench.flags import add_batch_size, add_preset
from dslide_workflows.bench.host import BUSY_CORES, other_cpu
from dslide_workflows.classifier import make_classifier

SUMMARY = "time each phase of a training step (per step and per active neuron)"

#: (module, attribute, phase): what is timed, in the order of a step.
PHASES = (
    ("dslide_dask.kernels.sparse_input", "forward", "input layer forward"),
    ("dslide_dask.model.lsh_index", "LSHIndex.buckets", "hash codes"),
    ("dslide_dask.kernels.active_sets", "active_sets", "active sets"),
    ("dslide_dask.kernels.adam", "group_rows", "group entries by neuron"),
    ("dslide_dask.kernels.adam", "chunk_bounds", "group entries by neuron"),
    ("dslide_dask.kernels.wide_layer", "forward_grouped", "logits and softmax sums"),
    ("dslide_dask.model.shared_negatives", "forward", "shared negatives: logits"),
    ("dslide_dask.kernels.wide_layer", "logit_gradients", "logit gradients"),
    ("dslide_dask.model.shared_negatives", "backward", "shared negatives: gradients"),
    ("dslide_dask.kernels.adam", "adam_grouped", "output rows: Adam and backprop"),
    ("dslide_dask.kernels.adam", "adam_given_rows", "shared negatives: Adam"),
    ("dslide_dask.kernels.adam", "adam_rows", "input rows: Adam"),
    ("dslide_dask.model.lsh_index", "LSHIndex.rebuild", "table rebuild (inserts)"),
)


class PhaseClock:
    """Exclusive time per phase: a phase called inside another is taken out of it."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self._stack: list[float] = []  # time spent in children of each open phase

    def timed(self, phase: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                children = self._stack.pop()
                self.seconds[phase] += spent - children
                if self._stack:
                    self._stack[-1] += spent

        return call


@contextmanager
def phases_timed(clock: PhaseClock) -> Iterator[None]:
    """Replace each attribute of :data:`PHASES` by a timed call while the block runs."""
    import importlib

    saved = []
    for module_name, attr, phase in PHASES:
        owner = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, clock.timed(phase, getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dslide bench profile``."""
    d = parser.add_argument_group("data (a synthetic preset, or XC text)")
    add_preset(d, about="synthetic preset")
    d.add_argument("--train", metavar="URL", help="XC text to train on instead of a preset")
    d.add_argument(
        "--points",
        type=positive_int,
        default=50_000,
        metavar="N",
        help="first N points of the (shuffled) training rows (default: 50000)",
    )
    d.add_argument("--cache-dir", type=Path, default=None, help="cache of generated presets")
    m = parser.add_argument_group("run")
    add_batch_size(m)
    m.add_argument("--steps", type=positive_int, default=150, help="steps timed (default: 150)")
    m.add_argument(
        "--warmup", type=positive_int, default=10, help="steps before timing (default: 10)"
    )
    m.add_argument("--threads", type=positive_int, default=2, help="(default: 2)")
    add_engine_opt(m, "negatives=shared (default: the classifier's defaults)")
    m.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write JSON")


def _data(args: argparse.Namespace):
    if args.train is None:
        spec = check_data_args(args.preset, 1, 1)  # the engine benchmark's file, if cached
        n_test = min(PRESET_POINTS[1], spec.n_test)
        path, _ = bench_data(args.preset, args.points, n_test, 0, args.cache_dir)
        return load_datasets(path)[0]
    from dslide_dask.data.batches import load

    data = load(args.train).shuffled(0)
    return data.slice(0, min(args.points, data.n_points))


def _clock_ghz() -> float | None:
    """The CPU clock /proc/cpuinfo reports (the first core's), in GHz; None if none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    except (OSError, ValueError):
        pass
    return None


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``warmup + steps`` steps and return the phase times of the last ``steps``."""
    import numba

    from dslide_dask.malloc import raise_malloc_thresholds
    from dslide_dask.model.network import SlideNetwork

    raise_malloc_thresholds()  # as the trainers do: a step's temporaries reuse pages
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    data = _data(args)
    params = {"n_threads": args.threads, "batch_size": args.batch_size, **dict(args.engine_opt)}
    clf = make_classifier(params)
    steps = args.warmup + args.steps
    epoch_steps = -(-data.n_points // args.batch_size)
    cfg = clf.config().for_data(data.n_labels, steps=steps, epoch_steps=epoch_steps)
    net = SlideNetwork(cfg, data.n_features, data.n_labels)
    batches = data.batches(args.batch_size)

    def step() -> float:
        nonlocal batches
        batch = next(batches, None)
        if batch is None:
            batches = data.batches(args.batch_size)
            batch = next(batches)
        stats = net.train_step(batch.X, batch.Y)
        return stats.active_per_example * int((np.diff(batch.Y.indptr) > 0).sum())

    for _ in range(args.warmup):
        step()
    clock = PhaseClock()
    active = 0.0
    host: dict[str, float] = {}
    with phases_timed(clock), other_cpu(host):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            active += step()
        total = time.perf_counter() - t0
    other = total - sum(clock.seconds.values())
    rows = [*clock.seconds.most_common(), ("other (Python, numpy)", other)]
    return {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "n_labels": data.n_labels,
        "samples_per_s": args.steps * args.batch_size / total,
        "ms_per_step": 1e3 * total / args.steps,
        "active_per_step": active / args.steps,
        "clock_ghz": _clock_ghz(),
        "phases": {name: seconds / args.steps for name, seconds in rows},
        "other_cpu_cores": host.get("other_cpu_cores"),
        "config": cfg.to_dict(),
    }


def format_report(result: dict[str, Any]) -> str:
    """The profile as a table (one line a phase, the step's total last)."""
    per_step = result["ms_per_step"] / 1e3
    active = result["active_per_step"]
    ghz = result["clock_ghz"]
    head = f"{'phase':32s} {'ms/step':>8s} {'share':>6s} {'ns/active':>10s}"
    lines = [head + (f" {'cycles/active':>14s}" if ghz else ""), "-" * (len(head) + 15 * bool(ghz))]

    def line(name: str, seconds: float) -> str:
        ns = 1e9 * seconds / max(active, 1)
        text = f"{name:32s} {1e3 * seconds:8.2f} {100 * seconds / per_step:5.1f}% {ns:10.1f}"
        return text + (f" {ns * ghz:14.0f}" if ghz else "")

    lines += [line(name, s) for name, s in result["phases"].items()]
    lines.append(line("step", per_step))
    lines.append(
        f"{result['samples_per_s']:.0f} samples/s, {active / result['batch_size']:.0f} active "
        f"neurons an example, {result['threads']} thread(s)"
        + (f", clock {ghz:.2f} GHz" if ghz else "")
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = profile(args)
    print(format_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.json}")
    if (result["other_cpu_cores"] or 0.0) > BUSY_CORES:
        print(
            f"warning: other processes used {result['other_cpu_cores']:.1f} cores while this "
            "ran: its timings are inflated"
        )
    return 0

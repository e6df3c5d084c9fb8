"""Each contender of a benchmark in its own fresh interpreter, limited to its threads:
the parent's :func:`run_contender` starts ``python -m dslide_workflows.bench.BENCH
--worker NAME``, whose :func:`bench_main` runs it and writes its result. ``dslide bench
accuracy`` makes the rows they all load with :func:`prepare_data`."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dslide_workflows.args import storage_options
from dslide_workflows.bench.data import (
    bench_data,
    check_data_args,
    load_datasets,
    save_datasets,
    save_exclusions,
)
from dslide_workflows.bench.host import busy_cpu_seconds
from dslide_workflows.errors import JobFailed

#: Synthetic presets: rows taken unless --train-points/--test-points say otherwise.
PRESET_POINTS = (50_000, 5_000)


def worker(
    name: str,
    data: Path,
    config: dict[str, Any],
    result: Path,
    runners: dict[str, Callable[..., dict[str, Any]]],
) -> None:
    """Child process body: load the data, run one contender, write its result as JSON."""
    from dslide_workflows.bench.torch_dense import peak_rss_mb

    train, test = load_datasets(data)
    data_rss = peak_rss_mb()
    out = runners[name](train, test, config)
    out["data_rss_mb"] = data_rss
    result.write_text(json.dumps(out, default=str))


def run_contender(
    name: str, data: Path, config: dict[str, Any], module: str = "dslide_workflows.bench.engine"
) -> dict[str, Any]:
    """Run one contender in a fresh interpreter limited to ``threads`` threads: ``python -m
    module --worker name ...`` (the benchmark's own ``main``)."""
    threads = str(config["classifier"]["n_threads"])
    env = dict(
        os.environ,
        NUMBA_NUM_THREADS=threads,
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        OPENBLAS_NUM_THREADS=threads,
    )
    with tempfile.TemporaryDirectory(prefix="dslide-bench-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            module,
            "--worker",
            name,
            "--data",
            str(data),
            "--config",
            json.dumps(config),
            "--result",
            str(result),
        ]
        busy0, child0, t0 = busy_cpu_seconds(), _children_cpu_seconds(), time.perf_counter()
        proc = subprocess.run(cmd, env=env)
        busy1, child1, wall = busy_cpu_seconds(), _children_cpu_seconds(), time.perf_counter()
        if proc.returncode != 0 or not result.exists():
            raise JobFailed(
                f"the {name} contender failed (exit {proc.returncode}); its output is above"
            )
        out = json.loads(result.read_text())
    out["process_seconds"] = wall - t0
    if busy0 is not None and busy1 is not None:  # CPU time nobody of ours used, in cores
        out["other_cpu_cores"] = max(0.0, (busy1 - busy0) - (child1 - child0)) / (wall - t0)
    return out


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_main(
    bench: str, runners: dict[str, Callable[..., dict[str, Any]]], argv: list[str] | None = None
) -> int:
    """``python -m dslide_workflows.bench.BENCH --worker NAME ...``: one of its contenders,
    the body of :func:`run_contender`'s child. The benchmark itself is ``dslide bench
    BENCH``."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog=f"python -m dslide_workflows.bench.{bench}",
        description=f"One contender of `dslide bench {bench}`, run in a fresh interpreter "
        f"by the benchmark; run the benchmark itself with `dslide bench {bench}`.",
    )
    p.add_argument("--worker", choices=tuple(runners), required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--config", type=json.loads, required=True)
    p.add_argument("--result", type=Path, required=True)
    a = p.parse_args(argv)
    worker(a.worker, a.data, a.config, a.result, runners)
    return 0


#: ``--filter-labels``' help.
FILTER_HELP = (
    "with --test: 'row label' pairs (0-based) left out of each test row's answers before "
    "every contender is scored (the XC Repository's filter_labels_test.txt)"
)


def prepare_data(args: argparse.Namespace, folder: Path) -> tuple[Path, dict[str, Any]]:
    """The .npz the contenders load (shuffled prefixes of train and test) and a
    description; URL data are read once here, presets come from bench engine's cache.
    ``--filter-labels``' pairs are shuffled with their rows and saved beside them."""
    if getattr(args, "filter_labels", None) and args.preset is not None:
        raise ValueError("--filter-labels: pairs of the rows of --test, not of a preset")
    if args.preset is not None:
        spec = check_data_args(args.preset, 1, 1)
        n_train = args.train_points or min(PRESET_POINTS[0], spec.n_train)
        n_test = args.test_points or min(PRESET_POINTS[1], spec.n_test)
        return bench_data(
            args.preset, n_train, n_test, args.data_seed, args.cache_dir, args.refresh_data
        )
    from dslide_dask.data.batches import load
    from dslide_dask.data.label_pairs import read_label_pairs
    from dslide_dask.metrics import widest_exclusion

    t0 = time.perf_counter()
    so = storage_options(args.storage_option) or None
    train, test = load(args.train, so), load(args.test, so)
    if (train.n_features, train.n_labels) != (test.n_features, test.n_labels):
        raise ValueError(
            f"--train has {train.n_features} features and {train.n_labels} labels but --test "
            f"has {test.n_features} and {test.n_labels}"
        )
    # real XC files are often sorted by label: shuffle before taking prefixes
    train = train.shuffled(args.data_seed).slice(0, args.train_points or train.n_points)
    order = np.random.default_rng(args.data_seed + 1).permutation(test.n_points)
    kept = order[: args.test_points or test.n_points]
    exclude = None
    if getattr(args, "filter_labels", None):  # the pairs follow their rows through the shuffle
        pairs = read_label_pairs(args.filter_labels, test.n_points, test.n_labels, so)
        exclude = pairs.take_rows(kept)
    test = test.take(kept)
    path = folder / "data.npz"
    save_datasets(path, train, test)
    info = {"train": args.train, "test": args.test, "seed": args.data_seed}
    if exclude is not None:
        save_exclusions(path, exclude)
        info.update(filter_labels=args.filter_labels, excluded_pairs=len(exclude.indices))
        info["excluded_widest"] = widest_exclusion(exclude)
    print(f"data: read {args.train} and {args.test} in {time.perf_counter() - t0:.1f} s")
    info.update(train_points=train.n_points, test_points=test.n_points)
    return path, info

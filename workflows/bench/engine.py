"""``dslide bench engine``: the SLIDE engine against a dense full-softmax PyTorch baseline.

Both contenders train the same network (sparse input -> hidden ReLU -> one output per
label, Adam, same batch size, learning rate and thread count) on the same prefix of a
shuffled synthetic preset, and are scored by exact P@1/3/5 on the same test rows. The
data are generated once and cached as .npz (``--cache-dir``); each contender runs in its
own fresh Python process, so peak RSS, thread pools and JIT state are its own.

Unless overridden, the engine runs with the settings that suit one pass over very many
labels (:data:`ENGINE_DEFAULTS`, lr 2e-2), and the dense baseline with the same learning
rate, Adam betas and ``init_std``.

"samples/s" is training samples over the training steps' wall time (network
construction, JIT compilation and every epoch's steps; not evaluation). "train s" is the
whole fit, and "fit end s" the part of it after the last step, where the engine
indexes its held rows and builds its label tree: models the dense baseline does not
have, so they count in the fit, not in the engine's speed. "1st batch s" is the part
spent until the first batch was done: construction plus compilation plus one step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dslide_workflows.args import key_value
from dslide_workflows.bench.contender import bench_main, run_contender
from dslide_workflows.bench.data import (
    bench_data,
    check_data_args,
    default_cache_dir,
)
from dslide_workflows.bench.flags import add_preset
from dslide_workflows.bench.host import BUSY_CORES
from dslide_workflows.classifier import add_model_arguments, classifier_params, make_classifier

SUMMARY = "SLIDE engine vs dense PyTorch full softmax: speed, P@k, memory"
CONTENDERS = ("engine", "dense")


#: Engine parameters of this benchmark unless overridden with --engine-opt: one pass over
#: 670K labels learns most with no Adam momentum and 1,500 active neurons an example
#: (see ``SlideConfig.beta1`` and the README's benchmark section).
ENGINE_DEFAULTS: dict[str, Any] = {"beta1": 0.0, "min_active": 1500}


def _defaults_text() -> str:
    return " ".join(f"{k}={v}" for k, v in ENGINE_DEFAULTS.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dslide bench engine``."""
    d = parser.add_argument_group("data")
    add_preset(d, about="synthetic preset")
    d.add_argument(
        "--train-points",
        type=int,
        default=50_000,
        metavar="N",
        help="train on the first N points of the shuffled train split (default: 50000)",
    )
    d.add_argument(
        "--test-points",
        type=int,
        default=5_000,
        metavar="N",
        help="score on the first N points of the shuffled test split (default: 5000)",
    )
    d.add_argument("--data-seed", type=int, default=0, help="generator seed (default: 0)")
    d.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"where generated data are kept (default: {default_cache_dir()})",
    )
    d.add_argument("--refresh-data", action="store_true", help="regenerate even if cached")
    add_model_arguments(parser, threads=2)
    c = parser.add_argument_group("contenders")
    add_engine_opt(c, f"K=8 --engine-opt hash_family=simhash (defaults: {_defaults_text()})")
    c.add_argument(
        "--dense-input",
        choices=("embedding_bag", "csr"),
        default="embedding_bag",
        help="sparse input layer of the dense baseline (default: embedding_bag)",
    )
    c.add_argument("--skip-engine", action="store_true", help="run only the dense baseline")
    c.add_argument("--skip-dense", action="store_true", help="run only the engine")
    c.add_argument(
        "--log-every",
        type=int,
        default=50,
        metavar="N",
        help="contenders print progress every N batches (default: 50; 0: never)",
    )
    c.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="OUT",
        help="also write config and results as JSON",
    )


def add_engine_opt(group: argparse._ArgumentGroup, example: str) -> None:
    """``--engine-opt K=V`` (repeatable): any SlideClassifier parameter; ``example``
    ends its help (an example, then the defaults)."""
    group.add_argument(
        "--engine-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="SlideClassifier parameter, value parsed as YAML (repeatable), e.g. --engine-opt "
        f"{example}",
    )


# -- contenders (each runs in its own process) -------------------------------------------------
def _progress(name: str, total: int, every: int) -> Callable[[int, int], None]:
    t0 = time.perf_counter()

    def report(step: int, samples: int) -> None:
        if every and step % every == 0:
            rate = samples / (time.perf_counter() - t0)
            print(
                f"  [{name}] step {step}  samples {samples}/{total}  {rate:.0f} samples/s",
                file=sys.stderr,
                flush=True,
            )

    return report


def run_engine(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """Fit a SlideClassifier on ``train`` and score it on ``test``."""
    from dslide_workflows.bench.torch_dense import peak_rss_mb

    clf = make_classifier(config["classifier"])
    report = _progress("engine", train.n_points * clf.epochs, config["log_every"])
    first: list[float] = []
    seen = [0]  # samples so far
    last = [0.0]  # seconds until the last step so far

    def callback(step: dict) -> None:
        last[0] = time.perf_counter() - t0
        if not first:
            first.append(last[0])
        seen[0] += step["samples"]
        report(step["step"], seen[0])

    t0, cpu0 = time.perf_counter(), time.process_time()
    clf.fit(train.X, train.Y, callback=callback)
    train_seconds = time.perf_counter() - t0
    train_cpu_seconds = time.process_time() - cpu0
    t1 = time.perf_counter()
    scores = clf.evaluate(test.X, test.Y, ks=(1, 3, 5))
    active = [h["active"] for h in clf.history_]
    return {
        "contender": "engine",
        "samples_per_s": seen[0] / (last[0] or train_seconds),
        "train_seconds": train_seconds,
        "fit_end_seconds": train_seconds - last[0] if last[0] else None,
        "train_cpu_seconds": train_cpu_seconds,
        "first_batch_seconds": first[0] if first else None,
        **scores,
        "eval_seconds": time.perf_counter() - t1,
        "active_per_example": float(np.mean(active)) if active else None,
        "params": {k: v for k, v in clf.get_params().items() if k != "client"},
        "peak_rss_mb": peak_rss_mb(),
    }


def run_dense(train, test, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Train and score the PyTorch dense baseline (``extra``: more ``train_dense`` keywords)."""
    from dslide_workflows.bench.torch_dense import train_dense

    c = config["classifier"]
    # the engine's settings, with the defaults of what was not given (lr: for these labels)
    engine = make_classifier(c).config().for_data(train.n_labels)
    return train_dense(
        train,
        test,
        hidden=tuple(c["hidden"]),
        batch_size=c["batch_size"],
        lr=engine.lr,
        betas=(engine.beta1, engine.beta2),
        init_std=engine.init_std,
        threads=c["n_threads"],
        epochs=c["epochs"],
        seed=engine.seed,
        input_layer=config["dense_input"],
        progress=_progress("dense", train.n_points * c["epochs"], config["log_every"]),
        **extra,
    )


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {"engine": run_engine, "dense": run_dense}


# -- report ------------------------------------------------------------------------------------
COLUMNS = (
    ("contender", "contender", "{}"),
    ("samples/s", "samples_per_s", "{:,.0f}"),
    ("train s", "train_seconds", "{:.1f}"),
    ("fit end s", "fit_end_seconds", "{:.1f}"),
    ("1st batch s", "first_batch_seconds", "{:.2f}"),
    ("P@1", "P@1", "{:.4f}"),
    ("P@3", "P@3", "{:.4f}"),
    ("P@5", "P@5", "{:.4f}"),
    ("peak RSS MB", "peak_rss_mb", "{:,.0f}"),
)


def comparison(results: list[dict[str, Any]]) -> dict[str, float]:
    """Engine/dense speed ratio and P@1 difference, when both ran."""
    by = {r["contender"].split()[0]: r for r in results}
    if "engine" not in by or "torch-dense" not in by:
        return {}
    e, d = by["engine"], by["torch-dense"]
    return {"speedup": e["samples_per_s"] / d["samples_per_s"], "p1_diff": e["P@1"] - d["P@1"]}


def format_table(results: list[dict[str, Any]], columns=COLUMNS) -> str:
    """One fixed-width table of the results (``columns``: header, key, format), plus
    ratio and warnings lines."""
    rows = [[h for h, _, _ in columns]]
    for r in results:
        rows.append(["-" if r.get(k) is None else f.format(r[k]) for _, k, f in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    cmp = comparison(results)
    if cmp:
        lines.append(
            f"engine/dense speed: {cmp['speedup']:.2f}x   P@1 engine - dense: {cmp['p1_diff']:+.4f}"
        )
    lines.extend(busy_warnings(results))
    return "\n".join(lines)


def busy_warnings(results: list[dict[str, Any]]) -> list[str]:
    """A warning for each contender during whose run other processes used the CPU."""
    return [
        f"warning: other processes used {r['other_cpu_cores']:.1f} cores while "
        f"{r['contender']} ran: its timings are inflated"
        for r in results
        if (r.get("other_cpu_cores") or 0.0) > BUSY_CORES
    ]


def run(args: argparse.Namespace) -> int:
    """``dslide bench engine``: data, then each contender in its own process, then a table."""
    if args.skip_engine and args.skip_dense:
        raise ValueError("--skip-engine and --skip-dense leave nothing to run")
    names = [n for n in CONTENDERS if not getattr(args, f"skip_{n}")]
    config = {
        "classifier": classifier_params(args, [*ENGINE_DEFAULTS.items(), *args.engine_opt]),
        "dense_input": args.dense_input,
        "log_every": args.log_every,
    }
    # fail on bad parameters now, not after the data are made
    if "engine" in names:
        make_classifier(config["classifier"])
    check_data_args(args.preset, args.train_points, args.test_points)
    if "dense" in names and importlib.util.find_spec("torch") is None:
        raise ValueError(
            "the dense baseline needs PyTorch: pip install 'dslide-dask[bench]' "
            "(or pass --skip-dense)"
        )
    data, info = bench_data(
        args.preset,
        args.train_points,
        args.test_points,
        args.data_seed,
        args.cache_dir,
        args.refresh_data,
    )
    results = []
    for name in names:
        print(f"running {name} ...", flush=True)
        results.append(run_contender(name, data, config))
    print()
    print(
        f"{args.preset}: {args.train_points} train / {args.test_points} test points, "
        f"hidden {','.join(map(str, args.hidden))}, batch {args.batch_size}, "
        f"lr {args.lr or 'auto'}, {args.epochs} epoch(s), {args.threads} thread(s)"
    )
    print(format_table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "data": info,
            "config": config,
            "results": results,
            **comparison(results),
            "host": _host(),
        }
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


def _host() -> dict[str, Any]:
    import platform
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for dist in ("dslide-dask", "numba", "numpy", "torch"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_avg": os.getloadavg(),
        "versions": versions,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m dslide_workflows.bench.engine --worker ...``: one contender."""
    return bench_main("engine", RUNNERS, argv)


if __name__ == "__main__":
    sys.exit(main())

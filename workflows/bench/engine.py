"""``dslide bench engine``: the SLIDE engine against a dense full-softmax PyTorch baseline.

Both contenders train the same network (sparse input -> hidden ReLU -> one output per
label, Adam, same batch size, learning rate and thread count) on the same prefix of a
shuffled synthetic preset, and are scored by exact P@1/3/5 on the same test rows. The
data are generated once and cached as .npz (``--cache-dir``); each contender runs in its
own fresh Python process, so peak RSS, thread pools and JIT state are its own.

Unless overridden, the engine runs with the settings that suit one pass over very many
labels (:data:`ENGINE_DEFAULTS`, lr 2e-2), and the dense baseline with the same learning
rate, Adam betas and ``init_std``.

"samples/s" is training samples over training wall time (network construction, JIT
compilation and every epoch; not evaluation). "1st batch s" is the part of that spent
until the first batch was done: construction plus compilation plus one step.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
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

from dslide_workflows.args import key_value
from dslide_workflows.cli import JobFailed, add_model_arguments, classifier_params, make_classifier

SUMMARY = "SLIDE engine vs dense PyTorch full softmax: speed, P@k, memory"
CONTENDERS = ("engine", "dense")
CACHE_FORMAT = 1  # bump when the cached arrays change meaning
#: CPU use by other processes (in cores) during a contender's run that earns a warning.
BUSY_CORES = 0.2


def default_cache_dir() -> Path:
    """``$DSLIDE_CACHE_DIR``, else ``$XDG_CACHE_HOME/dslide-dask``, else ``~/.cache/...``."""
    if os.environ.get("DSLIDE_CACHE_DIR"):
        return Path(os.environ["DSLIDE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dslide-dask"


#: Engine parameters of this benchmark unless overridden with --engine-opt: one pass over
#: 670K labels learns most with no Adam momentum and 1,500 active neurons an example
#: (see ``SlideConfig.beta1`` and the README's benchmark section).
ENGINE_DEFAULTS: dict[str, Any] = {"beta1": 0.0, "min_active": 1500}


def _defaults_text() -> str:
    return " ".join(f"{k}={v}" for k, v in ENGINE_DEFAULTS.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dslide bench engine``."""
    d = parser.add_argument_group("data")
    d.add_argument(
        "--preset", default="amazon-670k", help="synthetic preset (default: amazon-670k)"
    )
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


# -- data --------------------------------------------------------------------------------------
def check_data_args(preset: str, train_points: int, test_points: int):
    """The preset's spec, once the point counts are known to fit it."""
    from dslide_dask.data import synthetic

    spec = synthetic.resolve_spec(preset)
    if not 1 <= train_points <= spec.n_train:
        raise ValueError(f"--train-points must be in [1, {spec.n_train}], got {train_points}")
    if not 1 <= test_points <= spec.n_test:
        raise ValueError(f"--test-points must be in [1, {spec.n_test}], got {test_points}")
    return spec


def bench_data(
    preset: str,
    train_points: int,
    test_points: int,
    seed: int = 0,
    cache_dir: Path | None = None,
    refresh: bool = False,
    log: Callable[[str], None] = print,
) -> tuple[Path, dict[str, Any]]:
    """The cached .npz of the benchmark's train/test prefixes (made if missing) and a
    description of it. Train and test are shuffled before taking the prefixes (real XC
    files are sorted by label)."""
    from dslide_dask.data import synthetic

    spec = check_data_args(preset, train_points, test_points)
    key = json.dumps([CACHE_FORMAT, dataclasses.asdict(spec), synthetic.CHUNK_POINTS, seed])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"{preset}-seed{seed}-train{train_points}-test{test_points}-{digest}.npz"
    path = Path(cache_dir or default_cache_dir()) / "bench" / name
    info = {
        "preset": preset,
        "seed": seed,
        "train_points": train_points,
        "test_points": test_points,
        "spec": dataclasses.asdict(spec),
        "cache": str(path),
    }
    if path.exists() and not refresh:
        log(f"data: cached {path}")
        return path, info
    t0 = time.perf_counter()
    train, test = synthetic.make_synthetic(spec, seed=seed)
    train = train.shuffled(seed).slice(0, train_points)
    test = test.shuffled(seed + 1).slice(0, test_points)
    save_datasets(path, train, test)
    log(f"data: generated {preset} and cached {path} in {time.perf_counter() - t0:.1f} s")
    return path, info


def save_datasets(path: Path, train, test) -> None:
    """Write train/test XCDatasets to one .npz (atomically: temp file, then rename)."""
    arrays: dict[str, np.ndarray] = {}
    for split, ds in (("train", train), ("test", test)):
        arrays[f"{split}_X_indptr"] = ds.X.indptr
        arrays[f"{split}_X_indices"] = ds.X.indices
        arrays[f"{split}_X_data"] = ds.X.values()
        arrays[f"{split}_Y_indptr"] = ds.Y.indptr
        arrays[f"{split}_Y_indices"] = ds.Y.indices
    arrays["shape"] = np.array([train.n_features, train.n_labels], np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz.tmp", delete=False) as f:
        np.savez(f, **arrays)
    os.replace(f.name, path)


def load_datasets(path: Path):
    """The (train, test) XCDatasets written by :func:`save_datasets`."""
    from dslide_dask.data import CSR, XCDataset

    with np.load(path) as z:
        n_features, n_labels = (int(v) for v in z["shape"])
        out = []
        for split in ("train", "test"):
            X = CSR(
                z[f"{split}_X_indptr"], z[f"{split}_X_indices"], z[f"{split}_X_data"], n_features
            )
            Y = CSR(z[f"{split}_Y_indptr"], z[f"{split}_Y_indices"], None, n_labels)
            out.append(XCDataset(X, Y))
    return out[0], out[1]


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

    def callback(step: dict) -> None:
        if not first:
            first.append(time.perf_counter() - t0)
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
        "samples_per_s": seen[0] / train_seconds,
        "train_seconds": train_seconds,
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
        seed=c["seed"],
        input_layer=config["dense_input"],
        progress=_progress("dense", train.n_points * c["epochs"], config["log_every"]),
        **extra,
    )


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {"engine": run_engine, "dense": run_dense}


def worker(
    name: str,
    data: Path,
    config: dict[str, Any],
    result: Path,
    runners: dict[str, Callable[..., dict[str, Any]]] = RUNNERS,
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
        busy0, child0, t0 = _busy_cpu_seconds(), _children_cpu_seconds(), time.perf_counter()
        proc = subprocess.run(cmd, env=env)
        busy1, child1, wall = _busy_cpu_seconds(), _children_cpu_seconds(), time.perf_counter()
        if proc.returncode != 0 or not result.exists():
            raise JobFailed(
                f"the {name} contender failed (exit {proc.returncode}); its output is above"
            )
        out = json.loads(result.read_text())
    out["process_seconds"] = wall - t0
    if busy0 is not None and busy1 is not None:  # CPU time nobody of ours used, in cores
        out["other_cpu_cores"] = max(0.0, (busy1 - busy0) - (child1 - child0)) / (wall - t0)
    return out


def _busy_cpu_seconds() -> float | None:
    """Non-idle CPU seconds of the whole machine since boot (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10])  # already counted in user/nice
    return (sum(fields) - idle - guest) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- report ------------------------------------------------------------------------------------
COLUMNS = (
    ("contender", "contender", "{}"),
    ("samples/s", "samples_per_s", "{:,.0f}"),
    ("train s", "train_seconds", "{:.1f}"),
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
        f"hidden {','.join(map(str, args.hidden))}, batch {args.batch_size}, lr {args.lr:g}, "
        f"{args.epochs} epoch(s), {args.threads} thread(s)"
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

    versions = {}
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


def bench_main(
    bench: str, runners: dict[str, Callable[..., dict[str, Any]]], argv: list[str] | None = None
) -> int:
    """``python -m dslide_workflows.bench.BENCH``: ``dslide bench BENCH``, or with
    ``--worker NAME`` one of its contenders (the body of :func:`run_contender`'s child)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        p = argparse.ArgumentParser(prog=f"dslide bench {bench} --worker")
        p.add_argument("--worker", choices=tuple(runners), required=True)
        p.add_argument("--data", type=Path, required=True)
        p.add_argument("--config", type=json.loads, required=True)
        p.add_argument("--result", type=Path, required=True)
        a = p.parse_args(argv)
        worker(a.worker, a.data, a.config, a.result, runners)
        return 0
    from dslide_workflows.cli import main as cli_main

    return cli_main(["bench", bench, *argv])


def main(argv: list[str] | None = None) -> int:
    """``python -m dslide_workflows.bench.engine``: the benchmark, or one worker."""
    return bench_main("engine", RUNNERS, argv)


if __name__ == "__main__":
    sys.exit(main())

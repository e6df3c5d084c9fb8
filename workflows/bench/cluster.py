"""``dslide bench cluster``: dslide-dask against data-parallel PyTorch (DDP over gloo, what
Horovod does on CPUs) on an emulated cluster of N nodes joined by shaped links.

Each node is a network namespace with one link to a bridge, shaped with tc in both
directions (:mod:`dslide_workflows.cluster.netns`; needs root and iproute2). dslide-dask
runs a Dask scheduler and its client in a head namespace and one 1-thread worker per node;
DDP runs one 1-thread rank per node. Both train the same network (sparse input -> ReLU
hidden -> one output per label; dslide-dask computes only the LSH-active outputs) on the
same rows in the same order, with the same global batch (DDP splits it over its ranks).
Nodes are pinned to CPUs round robin: on a small machine compute is shared, so the
comparison is about communication.

"s/step" is wall time over the steps after the warm-up (between barriers for DDP; between
coordinator calls for dslide-dask, median of ``--repeats`` runs with the link rates
interleaved); "epoch" extrapolates it to one pass over the preset's full training set
(s/step x steps per epoch: no epoch is run). "bytes/step" is what all nodes sent on their
links during those steps, from the switch ports' counters (headers, control traffic and
all). P@1 is scored on the test rows after both contenders trained the same number of
samples, in the runs at the first link rate (learning does not depend on the link).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dslide_workflows.args import key_value, positive_int
from dslide_workflows.bench.distributed import DEFAULTS as DSLIDE_DEFAULTS
from dslide_workflows.bench.engine import (
    BUSY_CORES,
    bench_data,
    check_data_args,
    load_datasets,
)
from dslide_workflows.cluster.netns import (
    EmulatedCluster,
    NetnsUnavailable,
    bytes_sent,
    check_available,
    format_rate,
    parse_rate,
    read_counters,
)

SUMMARY = "dslide-dask vs PyTorch DDP on emulated nodes with shaped links (needs root)"
DEFAULT_RATES = "unlimited,10gbit,1gbit,100mbit"
SCHEDULER_PORT = 8786
MASTER_PORT = 29500
#: Steps per coordinator call of DistributedTrainer: dslide-dask's warm-up is a multiple.
STEPS_PER_CALL = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = parser.add_argument_group("data and model")
    d.add_argument("--preset", default="amazon-670k", help="(default: amazon-670k)")
    d.add_argument(
        "--train-points",
        type=positive_int,
        default=20_000,
        metavar="N",
        help="rows of the shuffled train split to draw steps from (default: 20000)",
    )
    d.add_argument(
        "--test-points",
        type=positive_int,
        default=2_000,
        metavar="N",
        help="test rows P@1 is scored on (default: 2000)",
    )
    d.add_argument("--batch-size", type=positive_int, default=256, help="global (default: 256)")
    d.add_argument("--lr", type=float, default=1e-2, help="both contenders (default: 1e-2)")
    d.add_argument(
        "--engine-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help=f"dslide-dask parameter (repeatable); defaults: {DSLIDE_DEFAULTS}",
    )
    d.add_argument("--seed", type=int, default=0)
    c = parser.add_argument_group("cluster")
    c.add_argument("--nodes", default="2,4", help="cluster sizes (default: 2,4)")
    c.add_argument(
        "--rates",
        default=DEFAULT_RATES,
        help=f"link rates, first one also scores P@1 (default: {DEFAULT_RATES})",
    )
    c.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="one-way delay per link end, needs sch_netem (default: 0)",
    )
    c.add_argument("--no-pin", action="store_true", help="do not pin nodes to CPUs")
    r = parser.add_argument_group("runs")
    r.add_argument(
        "--steps",
        type=positive_int,
        default=40,
        help="dslide-dask steps per run; both train this many for P@1 (default: 40)",
    )
    r.add_argument(
        "--warmup",
        type=int,
        default=10,
        help=f"untimed dslide-dask steps, a multiple of {STEPS_PER_CALL} (default: 10)",
    )
    r.add_argument(
        "--ddp-steps",
        type=positive_int,
        default=5,
        help="DDP steps per run after the first rate (default: 5)",
    )
    r.add_argument(
        "--ddp-warmup",
        type=int,
        default=2,
        help="untimed DDP steps; DDP rebuilds its buckets after step 1 and step 2 is still "
        "slow (default: 2)",
    )
    r.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="dslide-dask runs per rate, the median is reported (default: 3)",
    )
    r.add_argument("--skip-dslide", action="store_true")
    r.add_argument("--skip-ddp", action="store_true")
    r.add_argument("--no-eval", action="store_true", help="skip P@1 (DDP then always --ddp-steps)")
    r.add_argument(
        "--out",
        type=Path,
        default=Path("bench-cluster"),
        help="folder for cluster.md, cluster.png, cluster.json, logs/",
    )


# -- plan ----------------------------------------------------------------------------------
def check_args(args: argparse.Namespace) -> tuple[list[int], list[int | None]]:
    """Node counts and link rates, once every flag is known to be usable."""
    nodes = [int(n) for n in str(args.nodes).split(",") if n.strip()]
    if not nodes or min(nodes) < 1:
        raise ValueError(f"--nodes must list positive node counts, got {args.nodes!r}")
    rates = [parse_rate(r) for r in str(args.rates).split(",") if r.strip()]
    if not rates:
        raise ValueError("--rates must list at least one link rate")
    if args.warmup % STEPS_PER_CALL or not 0 < args.warmup < args.steps:
        raise ValueError(f"--warmup must be a multiple of {STEPS_PER_CALL} in (0, --steps)")
    if not 0 <= args.ddp_warmup < min(args.ddp_steps, args.steps):
        raise ValueError("--ddp-warmup must be in [0, --ddp-steps) and below --steps")
    if args.skip_dslide and args.skip_ddp:
        raise ValueError("--skip-dslide and --skip-ddp leave nothing to run")
    if max(args.steps, args.ddp_steps) * args.batch_size > args.train_points:
        raise ValueError("--train-points must cover --steps x --batch-size rows")
    if args.batch_size < max(nodes):
        raise ValueError("--batch-size must give every DDP rank at least one row")
    check_data_args(args.preset, args.train_points, args.test_points)
    return nodes, rates


def child_env() -> dict[str, str]:
    """Environment of every node process: one compute thread, quiet spinning."""
    one = {k: "1" for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                            "OPENBLAS_NUM_THREADS")}  # fmt: skip
    return {**os.environ, **one, "OMP_WAIT_POLICY": "PASSIVE", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _wait_all(net: EmulatedCluster, procs: list[subprocess.Popen], what: str, log: Path) -> None:
    """Wait for every process; if one fails, stop the rest and fail naming the log."""
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                net.stop(p)
            from dslide_workflows.cli import JobFailed

            raise JobFailed(f"{what} failed (exit codes {codes}); see {log}")
        if all(c == 0 for c in codes):
            return
        time.sleep(0.2)


# -- dslide-dask -----------------------------------------------------------------------------
@contextlib.contextmanager
def dask_cluster(net: EmulatedCluster, logs: Path) -> Iterator[str]:
    """A Dask scheduler in the head namespace and a 1-thread worker in each node."""
    address = f"tcp://{net.head_node.address}:{SCHEDULER_PORT}"
    py = [sys.executable, "-m"]
    log = open(logs / "dask.log", "ab")  # noqa: SIM115 - closed below
    procs = [net.popen(net.head_node, [*py, "distributed.cli.dask_scheduler", "--host",
                                       net.head_node.address, "--port", str(SCHEDULER_PORT),
                                       "--no-dashboard"], env=child_env(), stdout=log,
                       stderr=subprocess.STDOUT)]  # fmt: skip
    for node in net.nodes:
        argv = [*py, "distributed.cli.dask_worker", address, "--host", node.address,
                "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0",
                "--name", node.name, "--death-timeout", "60"]  # fmt: skip
        procs.append(net.popen(node, argv, env=child_env(), stdout=log, stderr=subprocess.STDOUT))
    try:
        yield address
    finally:
        for proc in reversed(procs):
            net.stop(proc)
        log.close()


def run_dslide(net: EmulatedCluster, scheduler: str, config: dict, logs: Path) -> dict:
    """One dslide-dask run, driven from the head namespace; its measurements."""
    result = logs / f"dslide-{config['tag']}.json"
    config = {**config, "scheduler": scheduler, "switch": net.switch, "result": str(result)}
    log_path = logs / f"dslide-{config['tag']}.log"
    with open(log_path, "wb") as log:
        argv = [sys.executable, "-m", "dslide_workflows.bench.cluster", "--runner",
                json.dumps(config)]  # fmt: skip
        proc = net.popen(net.head_node, argv, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        _wait_all(net, [proc], "the dslide-dask run", log_path)
    return json.loads(result.read_text())


def dslide_runner(config: dict[str, Any]) -> None:
    """In the head namespace: train on the Dask cluster, time the steps after the warm-up
    (read at a coordinator-call boundary), count their bytes, optionally score P@k."""
    from distributed import Client

    from dslide_dask import SlideConfig
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.distributed.trainer import STEPS_PER_CALL as PER_CALL

    if config["warmup"] % PER_CALL:  # the window opens between two coordinator calls
        raise ValueError(f"the warm-up must be a multiple of {PER_CALL} steps")
    train, test = load_datasets(Path(config["data"]))
    steps, warmup, batch = config["steps"], config["warmup"], config["batch_size"]
    cfg = SlideConfig(**config["params"])
    marks: dict[str, Any] = {}

    def mark(stats: dict) -> None:
        if stats["step"] == warmup:
            marks["c0"], marks["t0"] = read_counters(config["switch"]), time.perf_counter()

    with Client(config["scheduler"], timeout=60) as client:
        client.wait_for_workers(config["nodes"], timeout=120)
        with DistributedTrainer(client, cfg, train.n_features, train.n_labels) as trainer:
            history = trainer.train(train.slice(0, steps * batch), batch, epochs=1,
                                    seed=config["seed"], shuffle=False, callback=mark)  # fmt: skip
            t1, c1 = time.perf_counter(), read_counters(config["switch"])
            timed = steps - warmup
            out = {
                "seconds_per_step": (t1 - marks["t0"]) / timed,
                "bytes_per_step": bytes_sent(marks["c0"], c1) / timed,
                "timed_steps": timed,
                "samples": steps * batch,
                "step_seconds": [h["seconds"] for h in history],
                "payload_bytes_per_step": sum(
                    h["bytes_sent"] + h["bytes_received"] for h in history[warmup:]
                )
                / timed,
                "active": sum(h["active"] for h in history[warmup:]) / timed,
            }
            if config["evaluate"]:
                out.update(trainer.evaluate(test))
    Path(config["result"]).write_text(json.dumps(out))


# -- DDP ------------------------------------------------------------------------------------
def run_ddp(net: EmulatedCluster, config: dict, logs: Path, port: int) -> dict:
    """One DDP run, a rank in each node; rank 0's measurements."""
    result = logs / f"ddp-{config['tag']}.json"
    log_path = logs / f"ddp-{config['tag']}.log"
    master = f"{net.nodes[0].address}:{port}"
    with open(log_path, "wb") as log:
        procs = []
        for rank, node in enumerate(net.nodes):
            argv = [sys.executable, "-m", "dslide_workflows.bench.ddp", "--rank", str(rank),
                    "--world", str(len(net.nodes)), "--master", master, "--data", config["data"],
                    "--steps", str(config["steps"]), "--warmup", str(config["warmup"]),
                    "--batch-size", str(config["batch_size"]), "--lr", str(config["lr"]),
                    "--hidden", ",".join(map(str, config["hidden"])),
                    "--seed", str(config["seed"]), "--switch-netns", net.switch,
                    "--result", str(result)] + ["--evaluate"] * config["evaluate"]  # fmt: skip
            procs.append(net.popen(node, argv, env=child_env(), stdout=log, stderr=log))
        _wait_all(net, procs, "the DDP run", log_path)
    return json.loads(result.read_text())


# -- the benchmark ---------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """``dslide bench cluster``: every node count x link rate x contender, then a report."""
    from dslide_workflows.cli import JobFailed

    nodes, rates = check_args(args)
    try:
        check_available()
    except NetnsUnavailable as err:
        raise JobFailed(f"dslide bench cluster: {err}") from err
    spec = check_data_args(args.preset, args.train_points, args.test_points)
    path, info = bench_data(args.preset, args.train_points, args.test_points, args.seed)
    params = {**DSLIDE_DEFAULTS, "lr": args.lr, **dict(args.engine_opt), "seed": args.seed}
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    common = {"data": str(path), "batch_size": args.batch_size, "seed": args.seed,
              "lr": args.lr, "hidden": list(params["hidden"])}  # fmt: skip
    rows = []
    for n in nodes:
        with EmulatedCluster(n, delay_ms=args.delay_ms, pin=not args.no_pin) as net:
            if not args.skip_dslide:
                rows += _dslide_rates(net, n, rates, common, params, args, logs)
            if not args.skip_ddp:
                rows += _ddp_rates(net, n, rates, common, args, logs)
    steps_per_epoch = math.ceil(spec.n_train / args.batch_size)
    for row in rows:
        row["seconds_per_epoch"] = row["seconds_per_step"] * steps_per_epoch
    report = {"data": info, "params": params, "args": _jsonable(vars(args)),
              "steps_per_epoch": steps_per_epoch, "cpus": sorted(os.sched_getaffinity(0)),
              "rows": rows}  # fmt: skip
    write_report(args.out, report)
    return 0


def _dslide_rates(net, n, rates, common, params, args, logs) -> list[dict]:
    runs: list[list[dict]] = [[] for _ in rates]
    with dask_cluster(net, logs) as scheduler:
        for rep in range(args.repeats):  # rates interleaved: drifting load hits all alike
            for i, rate in enumerate(rates):
                net.shape(rate, args.delay_ms)
                evaluate = i == 0 and rep == 0 and not args.no_eval
                config = {**common, "params": params, "nodes": n, "steps": args.steps,
                          "warmup": args.warmup, "evaluate": evaluate,
                          "tag": f"{_tag(n, rate)}-{rep}"}  # fmt: skip
                with other_cpu(cpu := {}):
                    result = run_dslide(net, scheduler, config, logs)
                runs[i].append(_row("dslide-dask", n, rate, {**result, **cpu}))
    return [median_run(r) for r in runs]


def median_run(runs: list[dict]) -> dict:
    """The run with the median s/step (the faster of the middle two), with every run's
    s/step and the P@k of the run that scored them."""
    order = sorted(runs, key=lambda r: r["seconds_per_step"])
    row = dict(order[(len(order) - 1) // 2])
    row["repeat_seconds_per_step"] = [r["seconds_per_step"] for r in runs]
    row.update({k: v for r in runs for k, v in r.items() if k.startswith("P@")})
    return row


def _ddp_rates(net, n, rates, common, args, logs) -> list[dict]:
    rows = []
    for i, rate in enumerate(rates):
        net.shape(rate, args.delay_ms)
        evaluate = i == 0 and not args.no_eval
        config = {**common, "steps": args.steps if evaluate else args.ddp_steps,
                  "warmup": args.ddp_warmup, "evaluate": evaluate,
                  "tag": _tag(n, rate)}  # fmt: skip
        with other_cpu(cpu := {}):
            result = run_ddp(net, config, logs, MASTER_PORT + i)
        rows.append(_row("ddp", n, rate, {**result, **cpu}))
    return rows


def _tag(n: int, rate: int | None) -> str:
    """File name part of a run: ``4n-1Gbits``."""
    return f"{n}n-{format_rate(rate).replace(' ', '').replace('/', '')}"


def _row(contender: str, n: int, rate: int | None, result: dict) -> dict:
    row = {"contender": contender, "nodes": n, "rate_bps": rate, "link": format_rate(rate),
           **result}  # fmt: skip
    p1 = f"  P@1 {row['P@1']:.4f}" if "P@1" in row else ""
    print(f"{contender:<12}{n:>2} nodes  {row['link']:>11}  {row['seconds_per_step']:8.3f} s/step"
          f"  {row['bytes_per_step'] / 1e6:10.3f} MB/step  others' CPU "
          f"{row.get('other_cpu_cores', 0):.1f} cores{p1}", flush=True)  # fmt: skip
    return row


@contextlib.contextmanager
def other_cpu(out: dict) -> Iterator[None]:
    """Set ``out["other_cpu_cores"]``: CPU the machine spent outside this process tree
    during the block, in cores (timings are inflated when it is high)."""
    t0, busy0, ours0 = time.perf_counter(), _process_cpu_seconds(), _tree_cpu_seconds()
    yield
    wall, busy1, ours1 = time.perf_counter() - t0, _process_cpu_seconds(), _tree_cpu_seconds()
    if busy0 is not None and busy1 is not None:
        out["other_cpu_cores"] = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall


def _process_cpu_seconds() -> float | None:
    """CPU seconds since boot of all processes (user, nice, system) and of other guests of
    the hypervisor (steal), from /proc/stat; not interrupts, where the kernel moves our own
    packets between the veths."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _, _, _, _, steal = (int(v) for v in f.readline().split()[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def _jsonable(d: dict) -> dict:
    return {k: v if isinstance(v, int | float | str | bool | type(None)) else str(v)
            for k, v in d.items() if k != "func"}  # fmt: skip


# -- report ---------------------------------------------------------------------------------
def write_report(out: Path, report: dict) -> None:
    """cluster.json, cluster.md (table) and cluster.png (plot) under ``out``; print the table."""
    (out / "cluster.json").write_text(json.dumps(report, indent=2, default=str))
    table = format_table(report)
    (out / "cluster.md").write_text(table + "\n")
    plot(report, out / "cluster.png")
    print()
    print(table)
    print(f"\nwritten: {out / 'cluster.md'}, {out / 'cluster.png'}, {out / 'cluster.json'}")


def _pairs(rows: list[dict]) -> list[tuple[int, str, dict | None, dict | None]]:
    """(nodes, link, dslide row, DDP row) in run order."""
    keys = list(dict.fromkeys((r["nodes"], r["link"]) for r in rows))
    by = {(r["nodes"], r["link"], r["contender"]): r for r in rows}
    return [(n, link, by.get((n, link, "dslide-dask")), by.get((n, link, "ddp")))
            for n, link in keys]  # fmt: skip


def format_table(report: dict) -> str:
    """One markdown table: both contenders per node count and link rate, and the ratios."""
    rows = report["rows"]
    base = {(r["nodes"], r["contender"]): r for r in rows[::-1]}  # first rate of each
    lines = [
        "| nodes | link | dslide s/step | DDP s/step | dslide epoch | DDP epoch | DDP/dslide "
        "| dslide bytes/step | DDP bytes/step | dslide/DDP bytes | dslide vs first link "
        "| P@1 dslide | P@1 DDP |",
        "|---" * 13 + "|",
    ]
    for n, link, s, d in _pairs(rows):
        first = base.get((n, "dslide-dask"))
        cells = [
            str(n), link, _get(s, "seconds_per_step", "{:.3f}"),
            _get(d, "seconds_per_step", "{:.2f}"), _duration(s), _duration(d),
            f"{d['seconds_per_step'] / s['seconds_per_step']:.0f}x" if s and d else "-",
            _bytes(s), _bytes(d),
            f"{100 * s['bytes_per_step'] / d['bytes_per_step']:.3f}%" if s and d else "-",
            f"{s['seconds_per_step'] / first['seconds_per_step']:.2f}x" if s and first else "-",
            _get(s, "P@1", "{:.4f}"), _get(d, "P@1", "{:.4f}"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    samples = next((r["samples"] for r in rows if "P@1" in r), None)
    lines.append("")
    lines.append(
        f"Epoch = s/step x {report['steps_per_epoch']:,} steps (one pass over "
        f"{report['data']['spec']['n_train']:,} rows at batch {report['args']['batch_size']}), "
        "extrapolated from the timed steps. Bytes: all nodes' sent bytes on their links "
        "(switch port counters) per step."
        + (f" P@1 on {report['data']['test_points']:,} test rows after {samples:,} samples, "
           "measured at the first link rate." if samples else "")
    )  # fmt: skip
    busy = [r for r in rows if r.get("other_cpu_cores", 0.0) > BUSY_CORES]
    if busy:
        lines += ["", f"Timings inflated by other work on the machine (> {BUSY_CORES} cores):"]
    for r in busy:
        run = f"{r['contender']}, {r['nodes']} nodes, {r['link']}"
        lines.append(f"- other processes used {r['other_cpu_cores']:.1f} cores during {run}")
    return "\n".join(lines)


def _get(row: dict | None, key: str, fmt: str) -> str:
    return fmt.format(row[key]) if row and row.get(key) is not None else "-"


def _duration(row: dict | None) -> str:
    if not row:
        return "-"
    s = row["seconds_per_epoch"]
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _bytes(row: dict | None) -> str:
    if not row or row.get("bytes_per_step") is None:
        return "-"
    b = row["bytes_per_step"]
    return (
        f"{b / 1e3:.0f} KB" if b < 1e6 else f"{b / 1e6:.1f} MB" if b < 1e9 else f"{b / 1e9:.2f} GB"
    )


def plot(report: dict, path: Path) -> None:
    """Time per epoch and bytes per step against the link rate, one line a contender x nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for (contender, n), style in _series(rows):
        mine = {r["link"]: r for r in rows if r["contender"] == contender and r["nodes"] == n}
        xs = [i for i, link in enumerate(links) if link in mine]
        label = f"{contender}, {n} nodes"
        for ax, key, scale in (
            (axes[0], "seconds_per_epoch", 3600),
            (axes[1], "bytes_per_step", 1e6),
        ):
            ys = [mine[links[i]][key] / scale for i in xs]
            ax.plot(xs, ys, marker="o", label=label, **style)
    for ax, title in ((axes[0], "time per epoch (h, extrapolated)"),
                      (axes[1], "bytes on the wire per step (MB)")):  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(range(len(links)), links)
        ax.set_xlabel("link rate (each node)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{report['data']['preset']}: dslide-dask vs PyTorch DDP (gloo), emulated nodes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _series(rows: list[dict]) -> list[tuple[tuple[str, int], dict]]:
    """Line style of each (contender, nodes): colour by node count, dashed for DDP."""
    keys = list(dict.fromkeys((r["contender"], r["nodes"]) for r in rows))
    sizes = sorted({n for _, n in keys})
    return [
        (k, {"color": f"C{sizes.index(k[1])}", "ls": "-" if k[0] == "dslide-dask" else "--"})
        for k in keys
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m dslide_workflows.bench.cluster``: the benchmark, or its in-namespace runner."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--runner"]:
        dslide_runner(json.loads(argv[1]))
        return 0
    from dslide_workflows.cli import main as cli_main

    return cli_main(["bench", "cluster", *argv])


if __name__ == "__main__":
    sys.exit(main())

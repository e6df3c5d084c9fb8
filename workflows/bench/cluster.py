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
import math
import os
from pathlib import Path

from dslide_workflows.args import key_value, positive_int
from dslide_workflows.bench.cluster_report import write_report
from dslide_workflows.bench.cluster_runs import dask_cluster, run_ddp, run_dslide
from dslide_workflows.bench.data import bench_data, check_data_args
from dslide_workflows.bench.distributed import DEFAULTS as DSLIDE_DEFAULTS
from dslide_workflows.bench.flags import add_batch_size, add_preset
from dslide_workflows.bench.host import other_cpu
from dslide_workflows.cluster.netns import (
    EmulatedCluster,
    NetnsUnavailable,
    check_available,
    format_rate,
    parse_rate,
)

SUMMARY = "dslide-dask vs PyTorch DDP on emulated nodes with shaped links (needs root)"
DEFAULT_RATES = "unlimited,10gbit,1gbit,100mbit"
MASTER_PORT = 29500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = parser.add_argument_group("data and model")
    add_preset(d)
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
    add_batch_size(d, about="global")
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
        help="untimed dslide-dask steps, a multiple of the steps per coordinator call "
        "(10; default: 10)",
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
    from dslide_dask.distributed.trainer import STEPS_PER_CALL

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


# -- the benchmark ---------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """``dslide bench cluster``: every node count x link rate x contender, then a report."""
    from dslide_workflows.errors import JobFailed

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
    common = {
        "data": str(path),
        "batch_size": args.batch_size,
        "seed": args.seed,
        "lr": args.lr,
        "hidden": list(params["hidden"]),
    }
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
    report = {
        "data": info,
        "params": params,
        "args": _jsonable(vars(args)),
        "steps_per_epoch": steps_per_epoch,
        "cpus": sorted(os.sched_getaffinity(0)),
        "rows": rows,
    }
    write_report(args.out, report)
    return 0


def _dslide_rates(net, n, rates, common, params, args, logs) -> list[dict]:
    runs: list[list[dict]] = [[] for _ in rates]
    with dask_cluster(net, logs) as scheduler:
        for rep in range(args.repeats):  # rates interleaved: drifting load hits all alike
            for i, rate in enumerate(rates):
                net.shape(rate, args.delay_ms)
                evaluate = i == 0 and rep == 0 and not args.no_eval
                config = {
                    **common,
                    "params": params,
                    "nodes": n,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "evaluate": evaluate,
                    "tag": f"{_tag(n, rate)}-{rep}",
                }
                cpu: dict[str, float] = {}
                with other_cpu(cpu):
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
        config = {
            **common,
            "steps": args.steps if evaluate else args.ddp_steps,
            "warmup": args.ddp_warmup,
            "evaluate": evaluate,
            "tag": _tag(n, rate),
        }
        cpu: dict[str, float] = {}
        with other_cpu(cpu):
            result = run_ddp(net, config, logs, MASTER_PORT + i)
        rows.append(_row("ddp", n, rate, {**result, **cpu}))
    return rows


def _tag(n: int, rate: int | None) -> str:
    """File name part of a run: ``4n-1Gbits``."""
    return f"{n}n-{format_rate(rate).replace(' ', '').replace('/', '')}"


def _row(contender: str, n: int, rate: int | None, result: dict) -> dict:
    row = {
        "contender": contender,
        "nodes": n,
        "rate_bps": rate,
        "link": format_rate(rate),
        **result,
    }
    p1 = f"  P@1 {row['P@1']:.4f}" if "P@1" in row else ""
    print(
        f"{contender:<12}{n:>2} nodes  {row['link']:>11}  {row['seconds_per_step']:8.3f} s/step"
        f"  {row['bytes_per_step'] / 1e6:10.3f} MB/step  others' CPU "
        f"{row.get('other_cpu_cores', 0):.1f} cores{p1}",
        flush=True,
    )
    return row


def _jsonable(d: dict) -> dict:
    return {
        k: v if isinstance(v, int | float | str | bool | type(None)) else str(v)
        for k, v in d.items()
        if k != "func"
    }

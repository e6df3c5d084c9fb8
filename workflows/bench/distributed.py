"""``dslide bench distributed``: the in-process engine against the same run sharded over a
LocalCluster of 1, 2 and 4 worker processes, on the same data and cores.

Each row trains one pass over the same prefix of a synthetic preset with the same
parameters. "setup s" builds the model (weights, hash tables; on Dask also starting the
actors); "samples/s" is training samples over training wall time after setup; "bytes/step"
is what the coordinator sent to and received from the shards per step (activations,
labels, gradients, softmax partials), against a data-parallel all-reduce of the same
model (2 x parameters x 4 bytes). ``--step-modes actor,graph`` also runs each cluster
size with graph steps (each step as tasks named by phase, through the scheduler) and
prints the milliseconds per step each phase's tasks computed, from the scheduler's fine
performance metrics.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from dslide_workflows.args import key_value
from dslide_workflows.bench.data import bench_data, load_datasets
from dslide_workflows.bench.engine import ENGINE_DEFAULTS
from dslide_workflows.bench.flags import add_batch_size, add_preset

SUMMARY = "in-process engine vs LocalCluster of 1, 2, 4 workers: speed, bytes, P@k"

#: Engine parameters of this benchmark unless overridden with --engine-opt: those of
#: ``dslide bench engine`` (one pass over very many labels).
DEFAULTS: dict[str, Any] = {"hidden": (128,), "lr": 2e-2, **ENGINE_DEFAULTS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_preset(parser)
    parser.add_argument("--train-points", type=int, default=50_000, metavar="N")
    parser.add_argument("--test-points", type=int, default=2_000, metavar="N")
    add_batch_size(parser)
    parser.add_argument("--workers", default="1,2,4", help="cluster sizes to run (default: 1,2,4)")
    parser.add_argument("--threads", type=int, default=2, help="in-process threads (default: 2)")
    parser.add_argument("--threads-per-worker", type=int, default=1, help="(default: 1)")
    parser.add_argument(
        "--engine-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help=f"engine parameter (repeatable); defaults here: {DEFAULTS}",
    )
    parser.add_argument(
        "--coordinator-load",
        type=float,
        default=None,
        metavar="F",
        help="share of shard 0's worker kept for the hidden layers (default: the trainer's)",
    )
    parser.add_argument(
        "--step-modes",
        default="actor",
        metavar="M[,M]",
        help="step modes to run on each cluster: actor, graph (default: actor)",
    )
    parser.add_argument(
        "--hidden-shards",
        type=int,
        default=None,
        metavar="S",
        help="split the hidden layer's units over the first S workers "
        "(default: the trainer's choice, by memory)",
    )
    parser.add_argument(
        "--no-pipeline",
        dest="pipeline",
        action="store_false",
        help="actor steps one phase at a time, as graph steps are",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="runs of each contender; shows the median by samples/s",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")


def run_one(name: str, make_trainer, train, test, batch_size: int, seed: int) -> dict:
    """Set up, train one pass, evaluate; timings and traffic of one contender."""
    from dslide_dask.data.stream import Stream

    t0 = time.perf_counter()
    trainer = make_trainer()
    t1 = time.perf_counter()
    try:
        history = trainer.train(train, Stream(batch_size, seed=seed))
        t2 = time.perf_counter()
        shards = trainer.shard_info()
        scores = trainer.evaluate(test)
    finally:
        trainer.close()
    steady = history[5:] or history
    traffic = [h.get("bytes_sent", 0) + h.get("bytes_received", 0) for h in steady]
    return {
        "contender": name,
        "setup_s": t1 - t0,
        "train_s": t2 - t1,
        "samples_per_s": train.n_points / (t2 - t1),
        "steps": len(history),
        "step_ms": 1e3 * sum(h["seconds"] for h in steady) / len(steady),
        "bytes_per_step": sum(traffic) / len(traffic),
        "active": sum(h["active"] for h in steady) / len(steady),
        "coordinator_ms": 1e3 * sum(h.get("coordinator_seconds", 0) for h in steady) / len(steady),
        "wait_ms": 1e3 * sum(h.get("shard_wait_seconds", 0) for h in steady) / len(steady),
        "shard_busy_ms": [1e3 * s["busy_seconds"] / len(history) for s in shards],
        **scores,
    }


def run(args: argparse.Namespace) -> int:
    import numba
    from distributed import Client, LocalCluster

    from dslide_dask import SlideConfig
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.local_trainer import LocalTrainer

    workers = [int(w) for w in str(args.workers).split(",") if w]
    path, info = bench_data(args.preset, args.train_points, args.test_points, args.seed)
    train, test = load_datasets(path)
    params = {**DEFAULTS, **dict(args.engine_opt), "seed": args.seed}
    cfg = SlideConfig(**params)
    shape = (train.n_features, train.n_labels)
    allreduce = cfg.allreduce_bytes(*shape)
    options = {"pipeline": args.pipeline, "hidden_shards": args.hidden_shards}
    if args.coordinator_load is not None:
        options["coordinator_load"] = args.coordinator_load
    rows = []
    numba.set_num_threads(args.threads)
    rows.append(
        median_of(
            args.repeat,
            lambda: run_one(
                f"in-process, {args.threads} threads",
                lambda: LocalTrainer(cfg, *shape),
                train,
                test,
                args.batch_size,
                args.seed,
            ),
        )
    )
    print(format_row(rows[-1], allreduce), flush=True)
    modes = [m for m in str(args.step_modes).split(",") if m]
    for n in workers:
        with (
            LocalCluster(
                n_workers=n,
                threads_per_worker=args.threads_per_worker,
                processes=True,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            for mode in modes:
                before = phase_seconds(client)
                rows.append(
                    median_of(
                        args.repeat,
                        lambda client=client, n=n, mode=mode: run_one(
                            f"LocalCluster {n} x {args.threads_per_worker} thread"
                            + (", graph" if mode == "graph" else "")
                            + ("" if args.pipeline or mode == "graph" else ", no pipeline"),
                            lambda: DistributedTrainer(
                                client, cfg, *shape, step_mode=mode, **options
                            ),
                            train,
                            test,
                            args.batch_size,
                            args.seed,
                        ),
                    )
                )
                print(format_row(rows[-1], allreduce), flush=True)
                if mode == "graph":
                    after = phase_seconds(client)
                    steps = rows[-1]["steps"] * max(1, args.repeat)
                    rows[-1]["phase_ms"] = {
                        p: 1e3 * (after.get(p, 0.0) - before.get(p, 0.0)) / steps for p in after
                    }
                    print(format_phases(rows[-1]["phase_ms"]), flush=True)
    print()
    print(format_table(rows, allreduce))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"data": info, "params": params, "allreduce_bytes": allreduce, "results": rows},
                indent=2,
                default=str,
            )
        )
    return 0


#: Fine performance metrics' activities of a task's own function (not Dask's overhead).
TASK_ACTIVITIES = ("thread-cpu", "thread-noncpu")


def phase_seconds(client) -> dict[str, float]:
    """Seconds the cluster's tasks of each graph-step phase have spent, all runs so far."""
    from dslide_dask.distributed.graph_step import PHASES

    def metrics(dask_scheduler) -> dict:
        return dict(dask_scheduler.cumulative_worker_metrics)

    out = dict.fromkeys(PHASES, 0.0)
    for key, value in client.run_on_scheduler(metrics).items():
        # ("execute", prefix, activity, unit): the task functions' own time, CPU or not
        if len(key) != 4:
            continue
        context, prefix, activity, _ = key
        if context == "execute" and prefix in out and activity in TASK_ACTIVITIES:
            out[prefix] += value
    return out


def format_phases(phase_ms: dict[str, float]) -> str:
    """One line: each phase's ms per step (all shards' tasks of the phase together)."""
    return "  graph phases, ms/step: " + ", ".join(f"{p} {ms:.1f}" for p, ms in phase_ms.items())


def median_of(repeat: int, run) -> dict:
    """The run with the median samples/s of ``repeat`` runs, with the range of all."""
    runs = sorted((run() for _ in range(max(1, repeat))), key=lambda r: r["samples_per_s"])
    middle = dict(runs[len(runs) // 2])
    middle["samples_per_s_all"] = [r["samples_per_s"] for r in runs]
    return middle


HEADER = (
    f"{'contender':<34}{'setup s':>8}{'samples/s':>10}{'vs 1st':>7}{'step ms':>8}"
    f"{'coord':>6}{'wait':>6}{'KB/step':>9}{'% allred':>9}{'active':>7}{'P@1':>7}{'P@5':>7}"
)


def format_row(row: dict, allreduce: int, base: float | None = None) -> str:
    ratio = f"{row['samples_per_s'] / base:.2f}" if base else "1.00"
    return (
        f"{row['contender']:<34}{row['setup_s']:>8.1f}{row['samples_per_s']:>10.0f}"
        f"{ratio:>7}{row['step_ms']:>8.1f}{row['coordinator_ms']:>6.1f}{row['wait_ms']:>6.1f}"
        f"{row['bytes_per_step'] / 1e3:>9.0f}{100 * row['bytes_per_step'] / allreduce:>9.3f}"
        f"{row['active']:>7.0f}{row['P@1']:>7.4f}{row['P@5']:>7.4f}"
    )


def format_table(rows: list[dict], allreduce: int) -> str:
    base = rows[0]["samples_per_s"]
    lines = [HEADER, *(format_row(r, allreduce, base) for r in rows)]
    lines.append(f"data-parallel all-reduce of the same model: {allreduce / 1e6:.0f} MB/step")
    return "\n".join(lines)

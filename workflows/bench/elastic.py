"""``dslide bench elastic``: a run that gains workers mid-run against an undisturbed one.

Both runs train the same passes over the same prefix of a preset (default amazon-670k)
on a LocalCluster that starts with ``--workers`` worker processes. In the second,
``--join`` more are started when step ``--at-step`` is recorded (the run waits until they
are up); the trainer starts moving the model onto them at its next step boundary if the
move pays. Reported: how long the move was prepared while training went on and how much
slower those steps were; how long training stopped for the switch, in steps of the median
step time before the join; whether it went worker to worker or through a checkpoint; the
output rows and bytes that changed worker; whether every step was recorded exactly once;
samples/s and P@k of both runs. On a machine with fewer cores than workers, more workers
do not make steps faster, and preparing a move slows the steps: the policy prices a join
by what the last move cost (see docs/elastic.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from dslide_workflows.args import key_value
from dslide_workflows.bench.data import bench_data, load_datasets
from dslide_workflows.bench.distributed import DEFAULTS
from dslide_workflows.bench.flags import add_batch_size, add_preset

SUMMARY = "a run that gains workers mid-run vs an undisturbed one: the move, steps, P@k"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_preset(parser)
    parser.add_argument("--train-points", type=int, default=100_000, metavar="N")
    parser.add_argument("--test-points", type=int, default=5_000, metavar="N")
    add_batch_size(parser)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="at the start (default: 2)")
    parser.add_argument("--join", type=int, default=2, help="workers added (default: 2)")
    parser.add_argument("--at-step", type=int, default=200, help="when (default: 200)")
    parser.add_argument("--threads-per-worker", type=int, default=1, help="(default: 1)")
    parser.add_argument(
        "--through-storage",
        action="store_true",
        help="move through a checkpoint, as before live moves, to compare",
    )
    parser.add_argument(
        "--engine-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help=f"engine parameter (repeatable); defaults here: {DEFAULTS}",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")


def run(args: argparse.Namespace) -> int:
    from distributed import Client, LocalCluster

    from dslide_dask import SlideConfig
    from dslide_dask.checkpoint import CheckpointPolicy
    from dslide_dask.data.stream import Stream
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.distributed.moves.policy import ElasticPolicy

    path, info = bench_data(args.preset, args.train_points, args.test_points, args.seed)
    train, test = load_datasets(path)
    params = {**DEFAULTS, **dict(args.engine_opt), "seed": args.seed}
    cfg = SlideConfig(**params)
    stream = Stream(args.batch_size, epochs=args.epochs, seed=args.seed)
    rows = []
    for joining in (0, args.join):
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=args.threads_per_worker,
                processes=True,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
            tempfile.TemporaryDirectory() as store,
        ):
            elastic = ElasticPolicy(live=not args.through_storage)
            trainer = DistributedTrainer(
                client,
                cfg,
                train.n_features,
                train.n_labels,
                elastic=elastic,
                checkpoint=CheckpointPolicy(store),  # written only by a move through storage
            )

            def grow(record, joining=joining, cluster=cluster, client=client):
                if joining and record["step"] == args.at_step:
                    cluster.scale(args.workers + joining)
                    client.wait_for_workers(args.workers + joining)

            try:
                t0 = time.perf_counter()
                history = trainer.train(train, stream, grow)
                seconds = time.perf_counter() - t0
                scores = trainer.evaluate(test)
                moves = [asdict(m) for m in trainer.moves]
            finally:
                trainer.close()
        before = [h["seconds"] for h in history[5 : args.at_step]] or [float("nan")]
        after = [h["seconds"] for h in history[args.at_step + 5 :]] or [float("nan")]
        steps = [h["step"] for h in history]
        rows.append(
            {
                "run": f"{args.workers} workers"
                + (f", {joining} join at step {args.at_step}" if joining else ""),
                "seconds": seconds,
                "samples_per_s": sum(h["samples"] for h in history) / seconds,
                "steps": len(history),
                "each_step_once": steps == list(range(1, len(history) + 1)),
                "step_ms_before": 1e3 * statistics.median(before),
                "step_ms_after": 1e3 * statistics.median(after),
                "step_ms_while_preparing": [
                    1e3 * statistics.median([h["seconds"] for h in history[a:b]] or [float("nan")])
                    for a, b in (
                        (m["at_step"] - m["steps_while_preparing"], m["at_step"]) for m in moves
                    )
                ],
                "first_step_ms_after": [
                    1e3 * history[m["at_step"]]["seconds"]
                    for m in moves
                    if m["at_step"] < len(history)
                ],
                "moves": moves,
                **scores,
            }
        )
        print(format_row(rows[-1]), flush=True)
    print()
    print(format_report(rows))
    if args.json:
        args.json.write_text(
            json.dumps({"data": info, "params": params, "results": rows}, indent=2, default=str)
        )
    return 0


def format_row(row: dict) -> str:
    return (
        f"{row['run']:<36}{row['seconds']:>8.1f} s{row['samples_per_s']:>9.0f} samples/s"
        f"{row['steps']:>6} steps{' (each once)' if row['each_step_once'] else ' (NOT each once)'}"
        f"  step {row['step_ms_before']:.0f} -> {row['step_ms_after']:.0f} ms"
        f"  P@1 {row['P@1']:.4f}  P@5 {row['P@5']:.4f}"
    )


def format_report(rows: list[dict]) -> str:
    lines = [format_row(r) for r in rows]
    step_s = rows[-1]["step_ms_before"] / 1e3
    moves = zip(rows[-1]["moves"], rows[-1]["step_ms_while_preparing"], strict=True)
    for m, preparing_ms in moves:
        how = "live, worker to worker" if m["live"] else "through a checkpoint"
        began = m["at_step"] - m["steps_while_preparing"]
        if m["steps_while_preparing"]:
            lines.append(
                f"move begun at step {began}: new model prepared while training went on, "
                f"{m['prepare_seconds']:.2f} s, {m['steps_while_preparing']} steps "
                f"(median {preparing_ms:.0f} ms)"
            )
        lines.append(
            f"move at step {m['at_step']} onto {m['workers']} workers ({how}): training "
            f"stopped {m['seconds']:.2f} s = {m['seconds'] / step_s:.1f} steps of "
            f"{1e3 * step_s:.0f} ms; {m['rows_moved']:,} output rows "
            f"({m['bytes_moved'] / 1e6:.0f} MB) changed worker"
        )
        lines.append(
            f"what the move cost the run: {m['seconds'] + m['slowdown_seconds']:.2f} s "
            f"(the pause, and {m['slowdown_seconds']:.2f} s of slower steps while preparing) "
            f"= {(m['seconds'] + m['slowdown_seconds']) / step_s:.1f} steps"
        )
    if not rows[-1]["moves"]:
        lines.append("no move: the join did not pay (see docs/elastic.md)")
    if len(rows) == 2:
        lines.append(f"P@1 difference: {rows[1]['P@1'] - rows[0]['P@1']:+.4f}")
    if rows[-1]["first_step_ms_after"]:
        lines.append(
            f"first step after the move: {rows[-1]['first_step_ms_after'][0]:.0f} ms "
            f"(the pipeline starts again)"
        )
    return "\n".join(lines)

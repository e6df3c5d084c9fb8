"""``dslide bench checkpoint``: how long a model of a preset's shape takes to save and to
load on a LocalCluster, each shard writing and reading its own rows.

The model is built fresh (its weights' values do not change the bytes), saved to
``--out`` (default: a temporary folder, removed afterwards), and loaded into a new
model on the same workers. Reported: build, save and load seconds and the checkpoint's
size. The default is the 0.8-billion-parameter ``amazon-3m`` model with 256 hidden units
on 4 workers of 5.89 GiB, as trained in the README.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from dslide_workflows.args import key_value
from dslide_workflows.bench.flags import add_preset

SUMMARY = "save and load a model of a preset's shape on a LocalCluster: seconds, size"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_preset(parser, "amazon-3m", about="its shape")
    parser.add_argument("--hidden", type=int, default=256, help="(default: 256)")
    parser.add_argument("--workers", type=int, default=4, help="(default: 4)")
    parser.add_argument("--memory-limit", default="5.89GiB", help="each (default: 5.89GiB)")
    parser.add_argument("--out", type=Path, default=None, help="where (default: a temp folder)")
    parser.add_argument(
        "--engine-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="engine parameter (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    from distributed import Client, LocalCluster

    from dslide_dask import SlideConfig
    from dslide_dask.data.synthetic import resolve_spec
    from dslide_dask.distributed import DistributedTrainer

    spec = resolve_spec(args.preset)
    cfg = SlideConfig(**{"hidden": (args.hidden,), **dict(args.engine_opt)})
    shape = (spec.n_features, spec.n_labels)
    parameters = cfg.parameters(*shape)
    print(
        f"{args.preset} shape, hidden {args.hidden}: {parameters:,} parameters; "
        f"{args.workers} workers of {args.memory_limit}",
        flush=True,
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="dslide-bench-checkpoint-"))
    try:
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                memory_limit=args.memory_limit,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            t0 = time.perf_counter()
            with DistributedTrainer(client, cfg, *shape) as trainer:
                t1 = time.perf_counter()
                url = trainer.save(str(out / "model"))
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            with DistributedTrainer(client, cfg, *shape, restore=url):
                t4 = time.perf_counter()
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(
            f"build {t1 - t0:.1f} s, save {t2 - t1:.1f} s, load {t4 - t3:.1f} s; "
            f"{size / 1e9:.1f} GB in {url}"
        )
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    return 0

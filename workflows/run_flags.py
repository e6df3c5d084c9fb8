"""The flags of a run (data, cluster, model, training, run folder and checkpoints), shared
by ``dslide train`` and ``dslide plan``.

Apart from :mod:`dslide_workflows.train` because they are the run's interface, read by
two commands, while that module runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a run (data, cluster, model, training, run folder): ``dslide train``'s,
    shared with ``dslide plan``."""
    from dslide_workflows.args import (
        add_storage_arguments,
        byte_size,
        hidden_sizes,
        key_value,
        positive_int,
    )
    from dslide_workflows.security import add_security_arguments

    p.add_argument("--config", type=Path, metavar="YAML", help="run settings (see docs/cli.md)")
    src = p.add_argument_group("data")
    src.add_argument("--train", metavar="URL", help="training data (XC text format)")
    src.add_argument("--test", metavar="URL", help="test data, for evaluation")
    src.add_argument("--preset", help="generate this synthetic preset in memory instead")
    src.add_argument(
        "--skip-bad-lines",
        action="store_true",
        default=None,
        help="drop malformed lines and count them, instead of stopping",
    )
    src.add_argument(
        "--max-decompressed",
        type=byte_size,
        metavar="BYTES",
        help="refuse a compressed file that decompresses to more, e.g. 2GiB "
        "(default: a quarter of the reader's free memory)",
    )
    add_storage_arguments(src)
    c = p.add_argument_group("cluster")
    c.add_argument("--scheduler-address", metavar="ADDR", help="connect to this scheduler")
    add_security_arguments(c)
    c.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="LocalCluster workers (default: cores); with a scheduler address, "
        "wait until N workers have joined",
    )
    c.add_argument("--threads-per-worker", type=int, metavar="T", help="(default: 1)")
    c.add_argument("--in-process", action="store_true", default=None, help="no Dask at all")
    c.add_argument("--n-shards", type=int, metavar="S", help="(default: one per worker)")
    c.add_argument(
        "--hidden-shards",
        type=int,
        metavar="S",
        help="split the hidden layer's units over the first S workers (default: "
        "only when it would crowd the coordinator's worker)",
    )
    c.add_argument("--wire-dtype", choices=("float16", "float32"), help="(default: float16)")
    c.add_argument(
        "--no-pipeline",
        dest="pipeline",
        action="store_false",
        default=None,
        help="one phase at a time, no stale hidden activations",
    )
    c.add_argument(
        "--step-mode",
        choices=("actor", "graph"),
        help="graph: each step as tasks named by phase (hash, gather, softmax, "
        "scatter) for the dashboard and --performance-report; slower "
        "(default: actor)",
    )
    m = p.add_argument_group("model (also --opt K=V for any SlideClassifier parameter)")
    m.add_argument("--hidden", type=hidden_sizes, metavar="W[,W...]", help="(default: 128)")
    m.add_argument(
        "--lr",
        type=float,
        help="Adam learning rate of the dense parameters and base of the wide layers' "
        "(default: 1e-2, or 2e-2 from 100K labels; --opt input_lr=/output_lr= set those)",
    )
    m.add_argument("--hash-family", help="dwta or simhash (default: dwta)")
    m.add_argument("--K", type=int, help="hash codes per table (default: 6)")
    m.add_argument("--L", type=int, help="hash tables (default: 50)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=positive_int)
    t.add_argument("--batch-size", type=positive_int)
    t.add_argument("--threads", type=positive_int, help="numba threads with --in-process")
    t.add_argument("--eval-every", type=int, metavar="STEPS", help="(default: 0, at the end)")
    t.add_argument(
        "--eval-points",
        type=int,
        metavar="N",
        help="test rows, spread over the file (default: 2000)",
    )
    t.add_argument("--seed", type=int)
    t.add_argument(
        "--opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="model parameter, e.g. lr=1e-2 hidden=[256] L=50 (repeatable)",
    )
    t.add_argument("--performance-report", metavar="HTML", help="Dask performance report")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--verbose", action="store_true", help="print every setting (config.yaml)")
    t.add_argument(
        "--log-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="print a progress line every STEPS steps instead of a bar",
    )
    r = p.add_argument_group("run folder and checkpoints")
    r.add_argument(
        "--run-dir",
        metavar="URL",
        help="where config, metrics, curves, checkpoints and the model go "
        "(default: runs/DATE-TIME-DATA)",
    )
    r.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="STEPS",
        help="checkpoint every STEPS steps (default: 0, off)",
    )
    r.add_argument(
        "--checkpoint-minutes",
        type=float,
        metavar="MIN",
        help="checkpoint every MIN minutes (default: 0, off)",
    )
    r.add_argument(
        "--keep-checkpoints",
        type=int,
        metavar="N",
        help="newest checkpoints kept (default: 3; 0: all)",
    )

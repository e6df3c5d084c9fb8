"""The flags of a run (data, cluster, model, training, run folder and checkpoints), shared
by ``dslide train`` and ``dslide plan``.

Apart from :mod:`dslide_workflows.train` because they are the run's interface, read by
two commands, while that module runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: The model flags: ``SlideClassifier`` parameters given as flags of their own.
MODEL_FLAGS = ("hidden", "lr", "hash_family", "K", "L")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a run (data, cluster, model, training, run folder): ``dslide train``'s,
    shared with ``dslide plan``. The run settings' flags come from their schema
    (:mod:`dslide_workflows.run_schema`); the model's are ``SlideClassifier`` parameters."""
    from dslide_workflows.args import add_storage_arguments, hidden_sizes, key_value
    from dslide_workflows.run_schema import add_setting_flags
    from dslide_workflows.settings import model_parameters

    p.add_argument("--config", type=Path, metavar="YAML", help="run settings (see docs/cli.md)")
    src = p.add_argument_group("data")
    add_setting_flags(src, "data")
    add_storage_arguments(src)
    c = p.add_argument_group("cluster")
    add_setting_flags(c, "cluster")
    add_setting_flags(c, "security")
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
    add_setting_flags(t, "training")
    t.add_argument(
        "--opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="model parameter, e.g. lr=1e-2 hidden=[256] L=50 (repeatable); one of "
        + ", ".join(model_parameters()),
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--verbose", action="store_true", help="print every setting (config.yaml)")
    t.add_argument(
        "--log-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="print a progress line every STEPS steps instead of a bar",
    )
    add_setting_flags(p.add_argument_group("run folder and checkpoints"), "run")

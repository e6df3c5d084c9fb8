"""The model flags shared by ``dslide demo`` and the benchmarks, and the classifier they
make."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dslide_workflows.args import hidden_sizes, positive_int
from dslide_workflows.bench.flags import add_batch_size


def add_model_arguments(
    parser: argparse.ArgumentParser, *, threads: int | None, seed_help: str = "model seed"
) -> None:
    """The model flags of ``bench engine`` (``train`` takes its own, defaulting to the
    model's)."""
    g = parser.add_argument_group("model")
    g.add_argument(
        "--hidden",
        type=hidden_sizes,
        default=(128,),
        metavar="W[,W...]",
        help="hidden layer widths (default: 128)",
    )
    add_batch_size(g)
    g.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam learning rate of the dense parameters and base of the wide layers' "
        "(default: the model's, by the number of labels; --engine-opt input_lr=/output_lr= "
        "set those)",
    )
    g.add_argument("--epochs", type=positive_int, default=1, help="(default: 1)")
    g.add_argument(
        "--threads",
        type=positive_int,
        default=threads,
        help=f"compute threads (default: {threads or 'all cores'})",
    )
    g.add_argument("--seed", type=int, default=0, help=f"{seed_help} (default: 0)")


def classifier_params(args: argparse.Namespace, extra: Sequence[tuple[str, Any]] = ()) -> dict:
    """SlideClassifier keyword arguments from the common flags plus ``key=value`` extras."""
    params = {
        "hidden": tuple(args.hidden),
        "batch_size": args.batch_size,
        "lr": args.lr,
        "epochs": args.epochs,
        "n_threads": args.threads,
        "seed": args.seed,
    }
    params.update(extra)
    return params


def make_classifier(params: dict[str, Any]):
    """A SlideClassifier with ``params``, every one checked now (ValueError naming it)."""
    from dslide_dask import SlideClassifier

    params = dict(params)
    if isinstance(params.get("hidden"), list):
        params["hidden"] = tuple(params["hidden"])
    clf = SlideClassifier().set_params(**params)
    clf.config()
    return clf

"""The ``dslide`` command line: generate data, train, benchmark, demo.

Only wiring: every number comes from :mod:`dslide_dask`; this module parses flags, times
things and prints. Bad parameters end with one line ``dslide: error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from collections.abc import Sequence

from dslide_workflows import convert, datasets, evaluate, index, leave, plan, predict, report, train
from dslide_workflows.args import (
    add_storage_arguments,
    key_value,
    positive_int,
    storage_options,
)
from dslide_workflows.classifier import make_classifier
from dslide_workflows.endpoints import nul_setting
from dslide_workflows.errors import JobFailed, Terminated
from dslide_workflows.secrets import mask_text, mask_tracebacks, masked_output, scrub
from dslide_workflows.security import quiet_dask
from dslide_workflows.summary import format_scores

PROG = "dslide"
#: The longest error line: a value quoted from hostile input must not flood the terminal.
MAX_LINE = 300
#: The folders of an absolute path (two or more), before its last name.
_FOLDERS = re.compile(r"(?<![\w.])/(?:[^\s/,;()'\"]+/){2,}(?=[^\s/,;()'\"])")
#: 100K labels: the share of the output layer a step computes is what SLIDE is about.
DEMO_PRESET, DEMO_EPOCHS = "demo", 2


# -- generate ----------------------------------------------------------------------------------
SIZE_FLAGS = ("n_features", "n_labels", "n_train", "n_test", "avg_labels", "avg_nnz")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="write a synthetic data set in the Extreme Classification text format",
        description="Write train.txt and test.txt of a synthetic preset (optionally with "
        "changed sizes or statistics) under a folder: a local path or any fsspec URL.",
    )
    p.add_argument(
        "preset",
        nargs="?",
        default="tiny",
        help="tiny, demo, small, amazon-670k, amazon-3m, wiki-325k, delicious-200k (default: tiny)",
    )
    p.add_argument("--out", required=True, metavar="URL", help="output folder (path or URL)")
    for name in SIZE_FLAGS:
        kind = float if name.startswith("avg") else int
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            metavar="N",
            help=f"override the preset's {name}",
        )
    p.add_argument(
        "--spec-opt",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="override any other SyntheticSpec field (repeatable)",
    )
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument(
        "--threads", type=positive_int, default=None, help="generator threads (default: all)"
    )
    add_storage_arguments(p)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from dslide_dask.data import synthetic

    overrides = dict(args.spec_opt)
    overrides.update({k: getattr(args, k) for k in SIZE_FLAGS if getattr(args, k) is not None})
    spec = synthetic.resolve_spec(args.preset, **overrides)
    t0 = time.perf_counter()
    urls = synthetic.generate(
        spec,
        args.out,
        seed=args.seed,
        storage_options=storage_options(args.storage_option) or None,
        n_threads=args.threads,
    )
    print(
        f"generated {args.preset} (seed {args.seed}) in {time.perf_counter() - t0:.1f} s: "
        f"{spec.n_features} features, {spec.n_labels} labels"
    )
    print(f"  train: {urls['train']}  ({spec.n_train} points)")
    print(f"  test:  {urls['test']}  ({spec.n_test} points)")
    return 0


# -- bench -------------------------------------------------------------------------------------
def _add_bench(sub: argparse._SubParsersAction) -> None:
    from dslide_workflows.bench import (
        accuracy,
        checkpoint,
        cluster,
        distributed,
        elastic,
        engine,
        profile,
        storage,
        topk,
        tree_spread,
    )

    p = sub.add_parser("bench", help="benchmarks", description="Benchmarks.")
    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    for name, module in (
        ("engine", engine),
        ("distributed", distributed),
        ("storage", storage),
        ("cluster", cluster),
        ("accuracy", accuracy),
        ("topk", topk),
        ("elastic", elastic),
        ("checkpoint", checkpoint),
        ("profile", profile),
        ("trees-spread", tree_spread),
    ):
        q = bench.add_parser(
            name,
            help=module.SUMMARY,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(q)
        q.set_defaults(func=module.run)


# -- demo --------------------------------------------------------------------------------------
def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="train on a synthetic set of 100K labels and compare with a baseline",
        description="Generate a synthetic preset in memory, train a SLIDE classifier on it "
        "(in this process) and compare P@k with predicting the most frequent labels.",
    )
    p.add_argument(
        "--preset",
        default=DEMO_PRESET,
        help=f"a synthetic preset (default: {DEMO_PRESET}: 30K points, 100K labels)",
    )
    p.add_argument(
        "--epochs", type=positive_int, default=DEMO_EPOCHS, help=f"(default: {DEMO_EPOCHS})"
    )
    p.add_argument("--lr", type=float, default=None, help="(default: the recipe's, by labels)")
    p.add_argument("--threads", type=positive_int, default=None, help="(default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from dslide_dask import precision_at_k
    from dslide_dask.data import synthetic
    from dslide_dask.metrics import most_frequent_topk
    from dslide_workflows.progress import warm_kernels

    t0 = time.perf_counter()
    train, test = synthetic.make_synthetic(args.preset, seed=args.seed)
    print(
        f"data: synthetic '{args.preset}', {train.n_points:,} train / {test.n_points:,} test "
        f"points, {train.n_features:,} features, {train.n_labels:,} labels "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    clf = make_classifier(
        {
            "epochs": args.epochs,
            "lr": args.lr,
            "n_threads": args.threads,
            "seed": args.seed,
            "client": False,
        }
    )
    seen, active = [0], []

    def count(step: dict) -> None:
        seen[0] += step["samples"]
        active.append(step["active"])

    warm_kernels()  # a first run: what is compiling, and how far it is
    print("training", flush=True)
    t1 = time.perf_counter()
    clf.fit(train.X, train.Y, callback=count)
    seconds = time.perf_counter() - t1
    share = sum(active) / len(active)
    print(
        f"trained {seen[0]:,} samples in {seconds:.1f} s ({seen[0] / seconds:,.0f} samples/s), "
        f"{share:,.0f} of {train.n_labels:,} output neurons a sample "
        f"({share / train.n_labels:.1%})"
    )
    slide = clf.evaluate(test.X, test.Y, ks=(1, 3, 5))
    baseline = precision_at_k(most_frequent_topk(train.Y, test.n_points, 5), test.Y, (1, 3, 5))
    print(f"{'SLIDE':<24}{format_scores(slide)}")
    print(f"{'most frequent labels':<24}{format_scores(baseline)}")
    return 0


# -- main --------------------------------------------------------------------------------------
class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as every other error: one line ``dslide: error: ...``, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {mask_text(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Distributed SLIDE on Dask: LSH-sparse training of extreme classifiers.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (a bug report)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(sub)
    _add_generate(sub)
    train.add_train_parser(sub)
    plan.add_plan_parser(sub)
    leave.add_leave_parser(sub)
    report.add_report_parser(sub)
    convert.add_convert_parser(sub)
    datasets.add_datasets_parser(sub)
    predict.add_predict_parser(sub)
    evaluate.add_evaluate_parser(sub)
    index.add_index_parser(sub)
    _add_bench(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dslide``; returns the exit status (0; 2: bad input or parameters, or the
    system refused (a file, the disk, the network); 1: a job failed or an internal error).

    This is the one error boundary: every failure ends as one line ``dslide: error: ...``
    with secrets scrubbed, a traceback only with ``--debug`` (or DSLIDE_DEBUG=1).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if (name := nul_setting(vars(args))) is not None:
        parser.error(f"argument --{name.replace('_', '-')}: holds a NUL byte (no file name can)")
    from dslide_dask.omp import passive_wait

    passive_wait()  # before any kernel runs, in this process and the workers it starts
    try:
        # no secret in a print, ours or a library's; no Dask warning or chatter unless --debug
        with masked_output(), quiet_dask(args.debug or bool(os.environ.get("DSLIDE_DEBUG"))):
            return int(args.func(args) or 0)
    except KeyboardInterrupt as err:  # SIGTERM too, in dslide train (errors.Terminated)
        ended, code = ("terminated", 143) if isinstance(err, Terminated) else ("interrupted", 130)
        print(f"{PROG}: {ended}", file=sys.stderr)
        return code
    except Exception as err:
        if args.debug or os.environ.get("DSLIDE_DEBUG"):
            mask_tracebacks(_secrets(args))  # the traceback a bug report sends
            raise
        text, code = describe(err, args)
        line = f"{PROG}: error: {scrub(text, _secrets(args))}"
        print(_capped(line), file=sys.stderr)
        return code


def describe(err: BaseException, args: argparse.Namespace | None = None) -> tuple[str, int]:
    """One line for ``err`` and the exit status: 2 for bad input and what the system
    refused, 1 for a failed job, 1 and "internal error" for anything else (a bug)."""
    import yaml
    from distributed import KilledWorker

    if isinstance(err, MemoryError) and _in_dask_comm(err):  # a length read from garbage
        address = getattr(args, "scheduler_address", None) or os.environ.get(
            "DASK_SCHEDULER_ADDRESS", ""
        )
        return (
            f"--scheduler-address {address}: the other end does not speak Dask's protocol "
            "(not a Dask scheduler's port?)"
        ), 2

    if isinstance(err, JobFailed):
        return _one_line(err), 1
    if isinstance(err, KilledWorker):  # what their logs say, the client never hears
        tries = err.allowed_failures + 1
        who = "the worker" if tries == 1 else f"all {tries} workers"
        return (
            f"task {err.task!r} ended {who} that ran it ({err.last_worker.address} last; "
            "most often a memory limit: the workers' logs say)"
        ), 1
    if isinstance(err, ValueError | FloatingPointError | ImportError | yaml.YAMLError):
        return _one_line(err), 2  # the project's errors (XCFormatError, CheckpointError...)
    if isinstance(err, MemoryError):
        return "out of memory (a size in the input is larger than this machine can hold)", 2
    if isinstance(err, TimeoutError):
        return f"timed out: {_one_line(err)}", 2
    if isinstance(err, OSError):
        return _os_error(err), 2
    if type(err).__module__.split(".")[0] in _STORAGE_MODULES:  # botocore, aiohttp...
        return f"storage: {_one_line(err)}", 2
    return (
        f"internal error ({type(err).__name__}: {_one_line(err)}); run again with "
        f"--debug for the traceback, and please report it"
    ), 1


def _capped(line: str) -> str:
    """``line`` within :data:`MAX_LINE` characters: long paths cut to their file names
    (``.../cert.pem``), then if need be the middle elided, keeping the start (what
    failed) and the end (why)."""
    if len(line) <= MAX_LINE:
        return line
    line = _FOLDERS.sub(".../", line)
    if len(line) <= MAX_LINE:
        return line
    head = MAX_LINE * 3 // 5
    return f"{line[:head]} ... {line[len(line) - (MAX_LINE - head - 5) :]}"


def _in_dask_comm(err: BaseException) -> bool:
    """Whether ``err`` was raised reading a Dask connection (distributed.comm)."""
    frames = traceback.extract_tb(err.__traceback__)
    return any("distributed/comm/" in f.filename.replace("\\", "/") for f in frames)


#: Libraries whose errors mean storage or the network refused (not a bug here).
_STORAGE_MODULES = frozenset({"botocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "fsspec"})


def _os_error(err: OSError) -> str:
    """``file: reason`` for an OSError (``[Errno 30] Read-only file system: 'x'`` ->
    ``x: read-only file system``)."""
    if err.strerror and err.filename is not None:
        return f"{err.filename}: {err.strerror[0].lower()}{err.strerror[1:]}"
    if err.strerror:
        return err.strerror[0].lower() + err.strerror[1:]
    return _one_line(err)


def _secrets(args: argparse.Namespace) -> dict:
    """The storage options of this command (flags, and the resolved ones of ``train``),
    for scrubbing their secret values from an error line."""
    flags = {key: value for key, value in getattr(args, "storage_option", None) or []}
    return {"flags": flags, "resolved": getattr(args, "secret_options", None) or {}}


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())

"""``dslide evaluate MODEL TEST``: score a saved model on a test file, as tree users do.

Only wiring: the model is :meth:`SlideClassifier.load`'s (the whole model: network and,
when saved with them, the neighbours' votes, centroids and trees), the metrics
:meth:`SlideClassifier.evaluate`'s, the file read by the project's readers; on a cluster
(``--scheduler-address``, ``--workers``),
:func:`~dslide_dask.inference.graph.evaluate_on_cluster`'s. Prints P@k,
nDCG@k and PSP@k with the rows scored; ``--json`` keeps them. ``--filter-labels``
leaves the pairs of the XC Repository's ``filter_labels_test.txt`` out of the answers first,
as the published figures of its label-feature sets are scored.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack

from dslide_workflows.args import add_storage_arguments, byte_size, positive_int, storage_options
from dslide_workflows.security import add_cluster_arguments

#: The largest k: the top-k of every row is held at once (rows x k ids).
MAX_K = 1000


def cutoffs(text: str) -> tuple[int, ...]:
    """``1,3,5`` as the cut-offs k, each in [1, MAX_K], sorted, once each."""
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, e.g. 1,3,5; got {text!r:.40}"
        ) from None
    if not ks or ks[0] < 1 or ks[-1] > MAX_K:
        raise argparse.ArgumentTypeError(f"each k must be in [1, {MAX_K}], got {text!r:.40}")
    return tuple(ks)


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="P@k, nDCG@k and PSP@k of a saved model on a test file",
        description="Load the model at MODEL (a model folder saved by SlideClassifier.save "
        "or dslide train, a checkpoint, or a run folder; any fsspec URL) and score it on "
        "TEST (XC text or the converted layout, any fsspec URL): P@k, nDCG@k and, when the "
        "model kept its training label counts, PSP@k and PSnDCG@k, with the rows scored. "
        "In this process, or with --scheduler-address or --workers on a Dask cluster: "
        "each worker reads and answers its partitions of TEST, and only metric sums reach "
        "this process.",
    )
    p.add_argument("model", metavar="MODEL", help="model URL")
    p.add_argument("test", metavar="TEST", help="test data URL (XC text or converted)")
    p.add_argument(
        "--k",
        type=cutoffs,
        default=(1, 3, 5),
        metavar="K[,K...]",
        help=f"cut-offs, each in [1, {MAX_K}] (default: 1,3,5)",
    )
    p.add_argument(
        "--max-rows",
        type=positive_int,
        metavar="N",
        help="score N rows spread over the file (as dslide train's --eval-points; "
        "default: every row)",
    )
    p.add_argument(
        "--filter-labels",
        metavar="PAIRS",
        help="leave labels out of each row's answers before scoring: a file of 'row label' "
        "lines, 0-based (the XC Repository's filter_labels_test.txt, as published figures "
        "on its label-feature sets are scored)",
    )
    p.add_argument("--json", metavar="OUT", help="also write the metrics to OUT (path or URL)")
    p.add_argument(
        "--threads", type=positive_int, metavar="T", help="compute threads (default: cores)"
    )
    p.add_argument(
        "--max-decompressed",
        type=byte_size,
        metavar="BYTES",
        help="refuse a compressed test file that decompresses to more, e.g. 2GiB "
        "(default: a quarter of the free memory)",
    )
    add_cluster_arguments(
        p,
        address_default="none: this process",
        workers_help="score on a new LocalCluster of N workers (default: this process)",
    )
    add_storage_arguments(p)
    p.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dslide_dask.data.inputs import check_fits
    from dslide_dask.data.source import open_source
    from dslide_dask.inference.model_cache import resolve
    from dslide_workflows.secrets import mask_text
    from dslide_workflows.summary import format_scores

    so = storage_options(args.storage_option)
    ckpt = resolve(args.model, so)  # a run folder: its final model, else its latest checkpoint
    n_features, n_labels = int(ckpt.meta["n_features"]), int(ckpt.meta["n_labels"])
    if args.k[-1] > n_labels:
        raise ValueError(f"--k {args.k[-1]}: the model has {n_labels} labels (k <= that)")
    # the test file's header first: a file of other data fails before anything is read
    check_fits(open_source(args.test, so), n_features, n_labels, what=args.test)
    if args.json:
        _check_writable(args.json, so)  # before the work, not after it
    t0 = time.perf_counter()
    if args.scheduler_address or args.workers:
        scores, total, left_out = _on_cluster(args, so, ckpt)
        len_test = total
    else:
        scores, len_test, total, left_out = _here(args, so, ckpt, n_features, n_labels)
    seconds = time.perf_counter() - t0
    scored = f"all {total:,} rows" if len_test == total else f"{len_test:,} of {total:,} rows"
    print(f"model: {mask_text(ckpt.url)} ({n_features:,} features, {n_labels:,} labels)")
    print(f"test:  {mask_text(args.test)}: scored {scored} in {seconds:.1f} s")
    if left_out is not None:
        print(f"left out: {left_out:,} row-label pairs of {mask_text(args.filter_labels)}")
    for family in ("P", "nDCG", "PSP", "PSnDCG"):
        some = {
            f"{family}@{k}": scores[f"{family}@{k}"] for k in args.k if f"{family}@{k}" in scores
        }
        if some:
            print(format_scores(some))
    if "PSP@1" not in scores:
        print("(no PSP@k: the model was saved without its training label counts)")
    if args.json:
        _write_json(args.json, so, ckpt.url, args, len_test, total, scores)
    return 0


def _here(args, so: dict, ckpt, n_features: int, n_labels: int) -> tuple:
    """The metrics in this process, the rows scored and in the file, the pairs left out."""
    from dslide_dask import SlideClassifier
    from dslide_dask.data.dataset import spread_rows
    from dslide_dask.data.inputs import check_fits
    from dslide_dask.data.label_pairs import read_label_pairs
    from dslide_dask.data.source import read_dataset

    clf = SlideClassifier.load(ckpt.url, storage_options=so, answering=True)
    if args.threads:
        clf.set_params(n_threads=args.threads)
    test, _ = read_dataset(args.test, so, max_decompressed=args.max_decompressed)
    check_fits(test, n_features, n_labels, what=args.test)  # id by id
    if len(test) == 0:
        raise ValueError(f"{args.test}: no rows to score")
    total = len(test)
    exclude = None
    if args.filter_labels:
        exclude = read_label_pairs(args.filter_labels, total, n_labels, so)
    rows = spread_rows(total, args.max_rows)
    if rows is not None:
        test = test.take(rows)
        exclude = exclude.take_rows(rows) if exclude is not None else None
    scores = clf.evaluate(test.X, test.Y, ks=args.k, exclude=exclude)
    return scores, len(test), total, None if exclude is None else len(exclude.indices)


def _on_cluster(args, so: dict, ckpt) -> tuple:
    """The metrics on a cluster, every row scored where it is read; the rows and the
    pairs left out."""
    from dslide_dask.data.label_pairs import read_pairs
    from dslide_dask.data.source import open_source
    from dslide_dask.inference import PredictSpec
    from dslide_dask.inference.graph import check_input, evaluate_on_cluster
    from dslide_workflows.security import cli_client

    if args.max_rows:
        raise ValueError("--max-rows samples rows in this process: a cluster scores every row")
    if args.threads:
        raise ValueError("--threads threads this process: a cluster's workers take "
                         "--threads-per-worker")  # fmt: skip
    pairs = None
    if args.filter_labels:  # read, and each line checked, before a cluster starts
        pairs = read_pairs(args.filter_labels, int(ckpt.meta["n_labels"]), so)
        pairs.widest()
    spec = PredictSpec(ckpt.url, k=args.k[-1], storage_options=so)
    source = open_source(args.test, so, max_decompressed=args.max_decompressed)
    check_input(spec, source)
    with ExitStack() as stack:
        client = cli_client(stack, args, args.scheduler_address)
        scores, rows = evaluate_on_cluster(
            client, spec, source, args.k, exclude=pairs, show_progress=not args.no_progress
        )
    return scores, rows, None if pairs is None else len(pairs.rows)


def _check_writable(url: str, so: dict) -> None:
    """``--json OUT``'s folder must exist (a local one; object stores have none)."""
    import posixpath

    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **so)
    parent = posixpath.dirname(path.rstrip("/"))
    if "file" in fs.protocol and parent and not fs.isdir(parent):
        raise ValueError(f"--json {url}: its folder {parent} does not exist")
    if fs.isdir(path):
        raise ValueError(f"--json {url}: a folder, not a file name")


def _write_json(url: str, so: dict, model: str, args, rows: int, total: int, scores):
    import fsspec

    from dslide_workflows.secrets import mask_text

    record = {
        "model": mask_text(model),
        "test": mask_text(args.test),
        "filter_labels": mask_text(args.filter_labels) if args.filter_labels else None,
        "rows": rows,
        "rows_total": total,
        "metrics": scores,
    }
    with fsspec.open(url, "w", **so) as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print(f"metrics: {mask_text(url)}")

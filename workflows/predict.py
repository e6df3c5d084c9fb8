"""``dslide predict MODEL INPUT_URL OUTPUT_URL``: batch top-k predictions on a cluster.

Only wiring: the graph and the work are :mod:`dslide_dask.inference`'s. Rows are read
and results written by the workers, straight from and to storage; read them back with
``dslide_dask.inference.read_predictions(OUTPUT_URL)``.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import ExitStack

from dslide_workflows.args import (
    add_storage_arguments,
    add_table_arguments,
    byte_size,
    positive_int,
    storage_options,
)


def add_predict_parser(sub: argparse._SubParsersAction) -> None:
    from dslide_workflows.security import add_cluster_arguments

    p = sub.add_parser(
        "predict",
        help="top-k labels of every row of a data set, computed on a Dask cluster",
        description="Predict the top-k labels (ids and scores) of every row of INPUT_URL "
        "with the model at MODEL (a checkpoint, a model saved by SlideClassifier.save, or "
        "a run folder), as named tasks on a Dask cluster that read the rows from storage "
        "and write the results to the folder OUTPUT_URL (part-*.npz and predictions.json; "
        "read back with dslide_dask.inference.read_predictions).",
    )
    p.add_argument("model", metavar="MODEL", help="model URL")
    p.add_argument("input", metavar="INPUT_URL", help="rows: XC text or converted layout")
    p.add_argument("output", metavar="OUTPUT_URL", help="folder for the predictions")
    p.add_argument("--k", type=positive_int, default=5, help="labels per row (default: 5)")
    p.add_argument(
        "--format",
        choices=("npz", "xc"),
        default="npz",
        help="npz: the parts alone (default); xc: also OUTPUT_URL/predictions.txt, a line a "
        "row of label:score pairs best first, as XC tools write (converted here from the "
        "parts, one at a time)",
    )
    p.add_argument(
        "--filter-labels",
        metavar="PAIRS",
        help="leave labels out of each row's answers, k still given: a file of 'row label' "
        "lines, 0-based, rows in input order (the XC Repository's filter_labels_test.txt: "
        "a label-feature set's item is not its own answer)",
    )
    p.add_argument("--lsh", action="store_true", help="LSH top-k instead of exact")
    p.add_argument(
        "--tables",
        type=int,
        default=0,
        metavar="T",
        help="with --lsh: hash tables probed (default: 0, all)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=0,
        metavar="C",
        help="with --lsh or --index: labels scored a row and shard (default: 0: all found, "
        "or as the index was built)",
    )
    add_table_arguments(p, "with --lsh: ")
    p.add_argument(
        "--index",
        action="store_true",
        help="answer through the model's output index (built by `dslide index MODEL`): its "
        "candidates (--candidates C, default: as built), scored exactly",
    )
    p.add_argument(
        "--network-only",
        action="store_true",
        help="answer with the network alone, not the whole fused model (neighbours, label "
        "centroids and trees) a model saved with them answers with by default",
    )
    p.add_argument(
        "--partition-mb",
        type=positive_int,
        default=64,
        metavar="MB",
        help="split text input into byte ranges of MB (default: 64)",
    )
    p.add_argument(
        "--max-decompressed",
        type=byte_size,
        metavar="BYTES",
        help="refuse a compressed input file that decompresses to more, e.g. "
        "2GiB (default: a quarter of the reader's free memory)",
    )
    add_cluster_arguments(p)
    add_storage_arguments(p)
    p.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from dslide_dask.data.label_pairs import read_pairs
    from dslide_dask.data.source import open_source
    from dslide_dask.inference import PredictSpec, predict_to_storage
    from dslide_dask.inference.graph import check_input
    from dslide_dask.inference.model_cache import resolve
    from dslide_dask.inference.output import check_output
    from dslide_dask.inference.spec import MAX_INDEX_CANDIDATES
    from dslide_workflows.secrets import mask_text
    from dslide_workflows.security import cli_client

    if args.index and (args.lsh or args.mips or args.table):
        raise ValueError(
            "--index answers through the output index: not with --lsh, --mips or --table"
        )
    if args.index and not 0 <= args.candidates <= MAX_INDEX_CANDIDATES:
        raise ValueError(
            f"--candidates must be in [0, {MAX_INDEX_CANDIDATES}] with --index (0: as the "
            f"index was built), got {args.candidates}"
        )
    so = storage_options(args.storage_option)
    ckpt = resolve(args.model, so)
    pairs = None
    if args.filter_labels:  # read, and each line checked, before a cluster starts
        pairs = read_pairs(args.filter_labels, int(ckpt.meta["n_labels"]), so)
        pairs.widest()  # a row that leaves out too many labels: refused here too
    spec = PredictSpec(
        ckpt.url,
        k=args.k,
        exact=not (args.lsh or args.index),
        tables=args.tables,
        candidates=args.candidates,
        storage_options=so,
        mips=args.mips,
        index=tuple(args.table),
        output_index=args.index,
        fused=not args.network_only,
    )
    source = open_source(args.input, so, args.partition_mb << 20, args.max_decompressed)
    check_input(spec, source)  # bad input fails here, before a cluster starts
    check_output(args.output, len(source.partitions), so)  # as a link in the output folder
    if args.format == "xc":
        _check_text_output(args.output, so)
    address = args.scheduler_address or os.environ.get("DASK_SCHEDULER_ADDRESS")
    with ExitStack() as stack:
        client = cli_client(stack, args, address)
        t0 = time.perf_counter()
        meta = predict_to_storage(
            client, spec, source, args.output, show_progress=not args.no_progress, exclude=pairs
        )
        seconds = time.perf_counter() - t0
    n = meta["n_points"]
    way = "index" if spec.output_index else "exact" if spec.exact else "lsh"
    way = f"fused; the network's candidates {way}" if meta.get("fused") else way
    print(
        f"predicted top-{args.k} ({way}) of {n} rows in "
        f"{len(meta['parts'])} partitions in {seconds:.1f} s ({n / max(seconds, 1e-9):.0f} "
        f"rows/s) -> {args.output}"
    )
    if pairs is not None:
        print(f"left out: {meta['left_out']:,} row-label pairs of {mask_text(pairs.url)}")
    if args.format == "xc":
        from dslide_dask.inference.xc_output import write_xc_predictions

        text, rows = write_xc_predictions(args.output, so)
        print(f"XC text (label:score, best first): {rows} rows -> {text}")
    return 0


def _check_text_output(url: str, so: dict) -> None:
    """``predictions.txt`` is not a link out of the folder, nor a folder (before work)."""
    import fsspec

    from dslide_dask.inference.xc_output import TEXT_NAME
    from dslide_dask.paths import guard_write

    fs, path = fsspec.core.url_to_fs(url, **so)
    target = guard_write(fs, path, path.rstrip("/") + "/" + TEXT_NAME)
    if fs.isdir(target):
        raise ValueError(f"{url}: {TEXT_NAME} there is a folder: --format xc writes that file")

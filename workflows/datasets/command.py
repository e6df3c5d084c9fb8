"""``dslide datasets``: build the real Debian data sets from the apt lists, and the label
rows of a set that ships its labels' features."""

from __future__ import annotations

import argparse
import time

from dslide_workflows.args import add_storage_arguments, positive_int, storage_options

BUILDERS = {
    "debian": "Debian-26K: packages -> dependencies, debtags, section (about 26K labels)",
    "debian-files": "Debian-files: packages -> directories and shared file names they "
    "install, from the Contents indexes (about 125K labels)",
}


def add_datasets_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``dslide datasets debian|debian-files OUT`` and ``label-rows``."""
    from dslide_workflows.datasets import apt_lists, debian_files
    from dslide_workflows.datasets.xc_build import LABEL_ROWS

    p = subparsers.add_parser(
        "datasets",
        help="build a real data set from this machine's Debian metadata",
        description="Build a real extreme-classification data set (XC text format plus "
        "labels.txt, features.txt and stats.json) from the apt lists, or the label rows of "
        "a set that ships its labels' features. See docs/datasets.md.",
    )
    sets = p.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    for name, summary in BUILDERS.items():
        q = sets.add_parser(name, help=summary, description=summary)
        q.add_argument("out", metavar="OUT", help="output folder")
        q.add_argument(
            "--lists",
            default=apt_lists.LISTS,
            metavar="DIR",
            help=f"apt lists folder (default: {apt_lists.LISTS})",
        )
        q.add_argument("--arch", default=None, help="architecture (default: dpkg's)")
        q.add_argument(
            "--label-rows",
            action="store_true",
            help=f"also write {LABEL_ROWS}: a training row of each label's own name "
            "(train on 'OUT/train*.txt' to use them; see docs/datasets.md)",
        )
        q.set_defaults(func=cmd_datasets)
    files = sets.choices["debian-files"]
    files.add_argument(
        "--max-dirs",
        type=positive_int,
        default=debian_files.MAX_DIRS,
        metavar="N",
        help=f"drop packages with more directories (default: {debian_files.MAX_DIRS})",
    )
    files.add_argument(
        "--max-labels",
        type=positive_int,
        default=debian_files.MAX_LABELS,
        metavar="N",
        help="drop points with more labels after pruning (default: no cap)",
    )
    files.add_argument(
        "--max-label-points",
        type=positive_int,
        default=None,
        metavar="N",
        help="then keep only the labels of at most N training points, and the points "
        "left with one (20: nearly every label rare; default: every label)",
    )
    add_label_rows_parser(sets)
    return p


def add_label_rows_parser(sets: argparse._SubParsersAction) -> None:
    """``dslide datasets label-rows FEATURES OUT --train URL``."""
    summary = (
        "the label rows of a set that ships its labels' features (the XC Repository's "
        "LF- sets: Yf.txt, also called lbl_X_Xf.txt)"
    )
    q = sets.add_parser("label-rows", help=summary, description=summary + ".")
    q.add_argument(
        "features",
        metavar="FEATURES",
        help="label features: N_labels N_features, then a line a label of feature:value "
        "(any fsspec URL)",
    )
    q.add_argument("out", metavar="OUT", help="XC text to write, e.g. DIR/train-label-rows.txt")
    q.add_argument(
        "--train",
        required=True,
        metavar="URL",
        help="the training file whose labels and features they must match",
    )
    add_storage_arguments(q)
    q.set_defaults(func=cmd_label_rows)


def cmd_label_rows(args: argparse.Namespace) -> int:
    from dslide_workflows.datasets.label_features import write_label_rows

    so = storage_options(args.storage_option)
    rows = write_label_rows(args.features, args.out, args.train, so)
    print(
        f"wrote {rows.n_points} label rows of {rows.n_labels} labels to {args.out}: train on "
        "them beside the points with a glob (--train 'DIR/train*.txt')"
    )
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from dslide_workflows.datasets import debian, debian_files

    t0 = time.perf_counter()
    if args.dataset == "debian":
        stats = debian.build(args.out, args.lists, args.arch, label_rows=args.label_rows)
    else:
        stats = debian_files.build(
            args.out,
            args.lists,
            args.arch,
            max_dirs=args.max_dirs,
            max_labels=args.max_labels,
            max_label_points=args.max_label_points,
            label_rows=args.label_rows,
        )
    print(
        f"built {args.dataset} in {time.perf_counter() - t0:.1f} s -> {args.out}: "
        f"{stats['train']['points']} train / {stats['test']['points']} test points, "
        f"{stats['features']} features, {stats['labels']} labels, "
        f"{stats['train']['avg_labels_per_point']:.2f} labels a training point"
    )
    return 0

"""``dslide convert``: XC text (file, glob or folder; any fsspec URL) -> the chunked layout
that later epochs read much faster (see :mod:`dslide_dask.data.binary`)."""

from __future__ import annotations

import argparse

from dslide_workflows.args import add_storage_arguments, positive_int, storage_options


def add_convert_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``dslide convert``."""
    from dslide_dask.data.binary import CHUNK_POINTS

    p = subparsers.add_parser(
        "convert",
        help="convert XC text to the fast chunked layout",
        description="Read XC text from SRC (a file, glob or folder of part files; any "
        "fsspec URL; .gz/.bz2/.xz/.zst decompressed), validate it, and write npz chunks "
        "plus manifest.json under the folder DST. Training accepts either.",
    )
    p.add_argument("src", metavar="SRC", help="XC text: file, glob or folder URL")
    p.add_argument("dst", metavar="DST", help="output folder URL")
    p.add_argument(
        "--chunk-points",
        type=positive_int,
        default=CHUNK_POINTS,
        metavar="N",
        help=f"most points per chunk; chunks are made equal (default: {CHUNK_POINTS})",
    )
    add_storage_arguments(p)
    p.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="drop malformed lines (counted in the summary) instead of stopping",
    )
    p.set_defaults(func=cmd_convert)
    return p


def cmd_convert(args: argparse.Namespace) -> int:
    from dslide_dask.data.convert import convert

    s = convert(
        args.src,
        args.dst,
        chunk_points=args.chunk_points,
        storage_options=storage_options(args.storage_option) or None,
        skip_bad_lines=args.skip_bad_lines,
    )
    skipped = f", skipped {s.n_skipped} bad line(s)" if args.skip_bad_lines else ""
    print(
        f"converted {args.src} -> {s.url}: {s.n_points} points in {s.n_chunks} chunks, "
        f"{s.bytes_written / 1e6:.1f} MB in {s.seconds:.1f} s{skipped}"
    )
    return 0

"""``dslide convert``: XC text (file, glob or folder; any fsspec URL) -> the chunked layout
that later epochs read much faster (see :mod:`dslide_dask.data.binary`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from dslide_workflows.args import key_value, positive_int


def storage_options(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """fsspec storage options from ``--storage-option`` pairs; dotted keys nest
    (``client_kwargs.endpoint_url=http://127.0.0.1:9000``)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        *outer, leaf = key.split(".")
        d = out
        for k in outer:
            d = d.setdefault(k, {})
            if not isinstance(d, dict):
                raise ValueError(f"storage option {key!r} nests under a non-mapping value")
        d[leaf] = value
    return out


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """``--storage-option K=V`` (repeatable), shared with the storage benchmark."""
    parser.add_argument(
        "--storage-option",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="fsspec storage option, value parsed as YAML; dotted keys nest, e.g. "
        "client_kwargs.endpoint_url=http://127.0.0.1:9000 (repeatable)",
    )


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
        help=f"points per chunk (default: {CHUNK_POINTS})",
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
    from dslide_dask.data.binary import convert

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

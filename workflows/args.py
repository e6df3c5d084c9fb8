"""Argument types shared by the ``dslide`` subcommands."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterable
from typing import Any

import yaml


def key_value(text: str) -> tuple[str, Any]:
    """``key=value`` with the value parsed as YAML (``lr=1e-4``, ``hidden=[256,128]``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    from dslide_workflows.settings import load_yaml, yaml_problem

    shown = repr(text) if len(text) <= 80 else repr(text[:77] + "...")
    try:
        parsed = load_yaml(value)  # no aliases: "a=[&x [1,1], [*x,*x]]" nested would blow up
    except yaml.YAMLError as err:
        problem = yaml_problem(err)[1][:120]
        raise argparse.ArgumentTypeError(f"cannot parse the value of {shown}: {problem}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"{shown}: nested too deeply") from None
    if isinstance(parsed, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        with contextlib.suppress(ValueError):
            parsed = float(parsed)
    return key.strip(), parsed


def hidden_sizes(text: str) -> tuple[int, ...]:
    """Hidden layer widths: ``128`` or ``256,128``."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected widths like 128 or 256,128, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"hidden widths must be positive, got {text!r}")
    return sizes


def byte_size(text: str) -> int:
    """A positive number of bytes: ``500000000``, ``500MB``, ``2GiB``."""
    from dslide_workflows.settings import byte_count

    value = byte_count(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a size such as 2GiB or 500MB, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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


def add_table_arguments(parser: argparse.ArgumentParser, when: str = "") -> None:
    """``--table K=V`` and ``--mips``: the serving LSH tables a model is given before it
    answers (shared by ``dslide predict`` and ``dslide bench topk``); ``when`` leads
    their help (e.g. ``"with --lsh: "``)."""
    parser.add_argument(
        "--mips",
        action="store_true",
        help=f"{when}serving tables: SimHash under the inner-product transform",
    )
    parser.add_argument(
        "--table",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help=f"{when}serving tables' L, K, range_pow, bucket_capacity, ranges",
    )

"""Argument types shared by the ``dslide`` subcommands."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import yaml


def key_value(text: str) -> tuple[str, Any]:
    """``key=value`` with the value parsed as YAML (``lr=1e-4``, ``hidden=[256,128]``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"cannot parse the value of {text!r}: {err}") from err
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


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value

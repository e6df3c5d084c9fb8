"""The flags several benchmarks share, defined once: the synthetic ``--preset`` a
benchmark generates and its ``--batch-size``. Each command keeps its own default and
says in its own words what the flag means there; the help ends with the default."""

from __future__ import annotations

import argparse

from dslide_workflows.args import positive_int

#: The preset most benchmarks generate (Amazon-670K's shape).
PRESET = "amazon-670k"
#: Rows a training step takes, unless a benchmark says otherwise.
BATCH_SIZE = 256


def add_preset(
    parser: argparse._ActionsContainer, default: str | None = PRESET, about: str = ""
) -> None:
    """``--preset``: the synthetic preset (``dslide_dask.data.PRESETS``) to generate;
    ``about`` starts its help."""
    parser.add_argument("--preset", default=default, help=_help(about, default))


def add_batch_size(
    parser: argparse._ActionsContainer, default: int = BATCH_SIZE, about: str = ""
) -> None:
    """``--batch-size``: rows a step takes, an integer >= 1; ``about`` starts its help."""
    parser.add_argument(
        "--batch-size", type=positive_int, default=default, help=_help(about, default)
    )


def _help(about: str, default: object) -> str:
    """``about``, then ``(default: ...)`` if there is a default."""
    return about if default is None else f"{about} (default: {default})".lstrip()

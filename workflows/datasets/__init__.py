"""Real extreme-classification data sets built from this machine's Debian metadata
(``dslide datasets debian|debian-files OUT``; see docs/datasets.md)."""

from dslide_workflows.datasets.command import add_datasets_parser

__all__ = ["add_datasets_parser"]

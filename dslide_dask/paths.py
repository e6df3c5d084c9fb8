"""What a run folder or checkpoint store may reference: only names inside itself.

A ``LATEST`` file or a run's ``config.yaml`` is data from storage: edited (or hostile),
it could name ``../../elsewhere`` and make a resume read or overwrite files outside the
folder. Every reference read from such a file goes through :func:`inside`.
"""

from __future__ import annotations

import posixpath


class OutsideError(ValueError):
    """A reference read from a folder's files that points outside the folder."""


def inside(root: str, ref: str, where: str) -> str:
    """``root/ref`` if ``ref`` is a relative path that stays under ``root``; else
    :class:`OutsideError` naming ``where`` (the file that holds ``ref``)."""
    if not isinstance(ref, str) or not ref.strip():
        raise OutsideError(f"{where}: expected a name inside the folder, got {ref!r}")
    if "://" in ref or "::" in ref or ref.startswith(("/", "~", "\\")) or "\\" in ref:
        raise OutsideError(f"{where}: {ref!r} is not a relative name inside {root}")
    norm = posixpath.normpath(ref)
    if norm == ".." or norm.startswith("../") or norm == ".":
        raise OutsideError(f"{where}: {ref!r} points outside {root}")
    return posixpath.join(root.rstrip("/"), norm)

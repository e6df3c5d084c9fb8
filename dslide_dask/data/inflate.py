"""Decompressing a whole text file with a bound on its size, without storing blank floods.

A compressed file cannot be split, so a reader holds all of it decompressed, and a few
kilobytes of gzip stand for gigabytes (a "compression bomb"). :func:`inflate` reads the
stream in chunks and stops as soon as more than ``max_bytes`` have come out (by default
:func:`default_max_bytes`, a quarter of the memory free where it runs: the text and the
arrays parsed from it, up to twice its size, must fit together), with the reader's error
(an ``XCFormatError`` naming the file) saying the limit.

Blank lines after the last point are no data, but a file padded with a gigabyte of
newlines would still cost a gigabyte held: only the first :data:`KEEP_BLANKS` bytes of a
run of blanks at the end are kept. Should text follow such a run after all (blank lines
in the middle are an error, with a line number to report), the stream is read again
exactly, still within ``max_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

#: Bytes the parser takes for blanks (kernels.xc_text._is_sep).
BLANKS = b" \t\r\n"
#: Bytes of a trailing run of blanks kept (the rest are counted, not stored).
KEEP_BLANKS = 1 << 16
#: Bytes decompressed a read.
CHUNK = 1 << 20
#: The least :func:`default_max_bytes` gives, however little memory is free.
MIN_DEFAULT = 64 << 20


class _TextAfterBlanks(Exception):
    """Text follows a run of blanks that was not kept: read again, exactly."""


def default_max_bytes() -> int:
    """A quarter of the memory this process could still allocate (at least 64 MiB)."""
    from dslide_dask.memory import available_bytes

    return max(MIN_DEFAULT, available_bytes() // 4)


def inflate(
    stream: BinaryIO,
    max_bytes: int | None,
    reopen: Callable[[], BinaryIO],
    error: Callable[[str], Exception],
) -> bytearray:
    """The rest of the decompressing ``stream``, at most ``max_bytes`` bytes (None:
    :func:`default_max_bytes`), a trailing flood of blanks cut to :data:`KEEP_BLANKS`;
    ``reopen()`` gives the stream anew (a context manager); over the limit, ``error(what
    is wrong)`` is raised."""
    limit = default_max_bytes() if max_bytes is None else max_bytes
    if limit < 1:
        raise ValueError(f"max_decompressed must be >= 1 byte, got {limit}")
    try:
        return _read(stream, limit, error, squeeze=True)
    except _TextAfterBlanks:
        with reopen() as again:
            return _read(again, limit, error, squeeze=False)


def _read(stream: BinaryIO, limit: int, error: Callable, squeeze: bool) -> bytearray:
    out = bytearray()
    total = tail = dropped = 0  # bytes out; blanks ending `out`; blanks not kept
    while chunk := stream.read(min(CHUNK, limit + 1 - total)):  # limit + 1: over it?
        total += len(chunk)
        if total > limit:
            raise error(
                f"decompresses to more than {limit:,} bytes, the --max-decompressed limit "
                "(a compression bomb? raise the limit if the data are real)"
            )
        if not squeeze:
            out += chunk
            continue
        body = len(chunk.rstrip(BLANKS))
        if body:
            if dropped:
                raise _TextAfterBlanks
            out += chunk
            tail = len(chunk) - body
        else:
            kept = max(0, min(len(chunk), KEEP_BLANKS - tail))
            out += chunk[:kept]
            tail += kept
            dropped += len(chunk) - kept
    return out

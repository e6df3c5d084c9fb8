"""Decompressing a whole text file with a bound on its size, without storing blank floods.

A compressed file cannot be split, so a reader holds all of it decompressed, and a few
kilobytes of gzip stand for gigabytes (a "compression bomb"). :func:`inflate` reads the
stream in chunks and stops as soon as more than ``max_bytes`` have come out (by default
:func:`default_max_bytes`, a quarter of the memory free where it runs), with the reader's
error (an ``XCFormatError`` naming the file) saying the limit.

The text and the arrays parsed from it must fit together within :data:`PARSE_FACTOR`
times the limit (three quarters of the free memory by default). The arrays are not
always smaller than the text: a row ``0`` (2 bytes) costs 20 (two int64 offsets and a
label), a label ``0,`` 4 bytes, and checking a row for repeated ids copies them, up to
twice its line (one 3.4 GB line of labels: 5 times the text at its peak). So the stream
is charged as it comes out for its rows, commas, colons and longest line
(:class:`_ParseCost`), and refused, naming the longest line, once the parse would need
more than that.

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
#: Parsing may take this many times the limit, the text included.
PARSE_FACTOR = 3
#: Bytes the parser's arrays take (kernels.xc_text.parse_lines): a row (its newline)
#: two int64 offsets and its first label; a further label (its comma) an int32 id; a
#: feature (its colon) an int32 id and a float32 value; a row's ids copied to look for
#: repeats, per byte of its line (``0,0,0``: an int32 id every 2 bytes).
ROW_BYTES, LABEL_BYTES, FEATURE_BYTES, COPY_BYTES = 20, 4, 8, 2


class _TextAfterBlanks(Exception):
    """Text follows a run of blanks that was not kept: read again, exactly."""


class _ParseCost:
    """What parsing the text kept so far will take: counts of its newlines, commas and
    colons, and its longest line (measured across chunks: one inside a chunk is short)."""

    def __init__(self) -> None:
        self.lines = self.commas = self.colons = 0
        self.run = 0  # bytes of the line not yet ended
        self.longest = self.longest_at = 0  # bytes, 1-based line number

    def add(self, data: bytes) -> None:
        first = data.find(b"\n")
        if first >= 0:
            self._line(self.run + first)
            self.lines += data.count(b"\n")
            self.run = len(data) - data.rfind(b"\n") - 1
        else:
            self.run += len(data)
        self._line(self.run)
        self.commas += data.count(b",")
        self.colons += data.count(b":")

    def _line(self, length: int) -> None:
        if length > self.longest:
            self.longest, self.longest_at = length, self.lines + 1

    def peak(self, text: int) -> int:
        """Bytes of ``text`` bytes of text and the arrays parsed from it, at their peak."""
        arrays = ROW_BYTES * self.lines + LABEL_BYTES * self.commas  # lines: header + rows - 1
        return text + arrays + FEATURE_BYTES * self.colons + COPY_BYTES * self.longest


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
    cost = _ParseCost()
    blanks = b""  # blanks ending `out`, not yet charged
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
            cost.add(chunk)
        elif body := len(chunk.rstrip(BLANKS)):
            if dropped:
                raise _TextAfterBlanks
            out += chunk
            cost.add(blanks)  # text follows them: they end lines
            cost.add(chunk[:body])
            blanks = chunk[body:]
            tail = len(chunk) - body
        else:  # blanks: the first KEEP_BLANKS kept, rows to parse only if text follows
            kept = max(0, min(len(chunk), KEEP_BLANKS - tail))
            out += chunk[:kept]
            blanks += chunk[:kept]
            tail += kept
            dropped += len(chunk) - kept
        if cost.peak(len(out)) > PARSE_FACTOR * limit:
            raise error(
                f"parsed, it would take more than {PARSE_FACTOR} x the --max-decompressed "
                f"limit of {limit:,} bytes (lines read: {cost.lines + 1:,}; the longest, line "
                f"{cost.longest_at:,}: {cost.longest:,} bytes; raise the limit if the data "
                "are real)"
            )
    return out

"""What a compressed file must be before its decompressed bytes are trusted.

Two readers stay silent where the data is not what it seems. The zstd reader returns
whatever whole blocks a truncated stream holds, without an error: cut inside the first
block, that is nothing, which read as "empty file". The zip reader returns the first
member of an archive and ignores the others. :func:`zstd_cut` walks the zstd frames'
block headers (no decompression: a few bytes read per block) and :func:`zip_members`
counts a zip's files; each says what is wrong, for the reader to raise.
"""

from __future__ import annotations

import io
import zipfile

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE = 0x184D2A50  # to 0x184D2A5F: skippable frames (metadata)


def zstd_cut(raw: bytes) -> str | None:
    """How ``raw`` fails to be whole zstd frames (the file cut short), or None."""
    problem = _zstd_problem(memoryview(raw))
    return f"truncated zstd stream ({problem}: the file is cut short?)" if problem else None


def _zstd_problem(buf: memoryview) -> str | None:
    """What is wrong with the frame structure of ``buf`` (None: whole frames)."""
    pos, n = 0, len(buf)
    while pos < n:
        if n - pos < 4:
            return f"{n - pos} stray byte(s) after the last frame"
        magic = int.from_bytes(buf[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == _SKIPPABLE:
            if n - pos < 8:
                return "a skippable frame ends in its header"
            pos += 8 + int.from_bytes(buf[pos + 4 : pos + 8], "little")
            if pos > n:
                return "a skippable frame ends early"
            continue
        if magic != _ZSTD_MAGIC:
            return f"no zstd frame at byte {pos}"
        pos += 4
        if pos >= n:
            return "the file ends in a frame header"
        descriptor = buf[pos]
        fcs_flag, single, checksum, dict_flag = (
            descriptor >> 6,
            (descriptor >> 5) & 1,
            (descriptor >> 2) & 1,
            descriptor & 3,
        )
        header = 1 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        header += (1 if single else 0, 2, 4, 8)[fcs_flag]
        pos += header
        while True:
            if pos + 3 > n:
                return "the file ends in a block header"
            block = int.from_bytes(buf[pos : pos + 3], "little")
            last, kind, size = block & 1, (block >> 1) & 3, block >> 3
            if kind == 3:
                return f"a reserved block type at byte {pos}"
            pos += 3 + (1 if kind == 1 else size)
            if pos > n:
                return "the file ends inside a block"
            if last:
                break
        pos += 4 if checksum else 0
        if pos > n:
            return "the file ends in a frame's checksum"
    return None


def zip_members(raw: bytes) -> str | None:
    """What is wrong if the zip archive ``raw`` holds more than one file (which of them
    is the data is not ours to guess), or None. Bytes that are not a whole zip archive
    (a prefix) are left to the zip reader to refuse."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            names = [i.filename for i in archive.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    if len(names) < 2:
        return None
    shown = ", ".join(repr(n[:40]) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return (
        f"a zip archive of {len(names)} files ({shown}): a data file must be the only "
        "file in its zip"
    )

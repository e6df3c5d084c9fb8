"""Reading this machine's apt lists: finding the index files, decompressing them, parsing
deb822 stanzas, and choosing each binary package's candidate record (its highest version).

Everything that touches files takes the lists folder as an argument (default
:data:`LISTS`), so the builders run on any snapshot of ``/var/lib/apt/lists``, and the
tests on small synthetic folders.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from dslide_dask.errors import DslideError

LISTS = "/var/lib/apt/lists"
#: Fetches Packages and Translation-en (the long descriptions) into LISTS.
FETCH_LISTS = "apt-get update -o Acquire::Languages=en"
#: Fetches the Contents indexes too (apt-file enables them; a plain `apt-file update`
#: runs with the default languages, which here removes Translation-en).
FETCH_CONTENTS = "apt-get install -y apt-file && apt-get update -o Acquire::Languages=en"
APT_HELPER = "/usr/lib/apt/apt-helper"
COMPRESSIONS = ("", ".gz", ".xz", ".bz2", ".lz4", ".zst")
_PY_OPENERS: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
_TOOLS = {".lz4": "lz4", ".zst": "zstd"}


class MissingAptData(DslideError, ValueError):
    """The apt lists lack an index a builder needs; the message says how to fetch it."""


def native_arch() -> str:
    """``dpkg --print-architecture`` (amd64 when dpkg is not there)."""
    try:
        out = subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip() or "amd64"
    except (OSError, subprocess.CalledProcessError):
        return "amd64"


def index_files(lists_dir: str, kind: str) -> list[str]:
    """The index files of one kind (``binary-amd64_Packages``, ``i18n_Translation-en``,
    ``Contents-all``...) in ``lists_dir``, any compression, sorted by name."""
    if not os.path.isdir(lists_dir):
        return []
    pattern = re.compile(
        rf"_{re.escape(kind)}({'|'.join(re.escape(c) for c in COMPRESSIONS if c)})?$"
    )
    names = sorted(n for n in os.listdir(lists_dir) if pattern.search(n))
    return [os.path.join(lists_dir, n) for n in names]


def require(paths: list[str], what: str, lists_dir: str, fetch: str) -> list[str]:
    """``paths``, or :class:`MissingAptData` naming the command that fetches them."""
    if not paths:
        raise MissingAptData(f"no {what} in {lists_dir}: run `{fetch}` (as root) first")
    return paths


@contextlib.contextmanager
def open_index(path: str) -> Iterator[IO[bytes]]:
    """A binary stream of an index file's decompressed bytes (by its extension)."""
    ext = os.path.splitext(path)[1]
    if ext in _TOOLS:
        if os.access(APT_HELPER, os.X_OK):
            cmd = [APT_HELPER, "cat-file", path]
        elif shutil.which(_TOOLS[ext]):
            cmd = [_TOOLS[ext], "-dc", path]
        else:
            raise MissingAptData(f"{path}: cannot decompress (no {APT_HELPER}, no {_TOOLS[ext]})")
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
            stdout = proc.stdout
            assert stdout is not None  # stdout=PIPE
            yield stdout
            stdout.read()  # drain, so the tool ends on its own
        if proc.returncode:
            raise OSError(f"{path}: {cmd[0]} failed with status {proc.returncode}")
    else:
        with _PY_OPENERS.get(ext, open)(path, "rb") as f:
            yield f


def read_index(path: str) -> str:
    """The whole text of an index file."""
    with open_index(path) as f:
        return f.read().decode("utf-8", "replace")


def parse_deb822(text: str) -> Iterator[dict[str, str]]:
    """One ``{field: value}`` a stanza; continuation lines (leading blank) are appended
    to the field's value after a newline, without their first character."""
    record: dict[str, str] = {}
    field = None
    for line in text.splitlines():
        if not line.strip():
            if record:
                yield record
            record, field = {}, None
        elif line[0] in " \t":
            if field is not None:
                record[field] += "\n" + line[1:]
        elif ":" in line:
            field, _, value = line.partition(":")
            record[field] = value.strip()
    if record:
        yield record


def _order(char: str) -> int:
    """dpkg's weight of a non-digit character: ~ sorts before everything, letters before
    other symbols."""
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or revision: non-digit runs by
    :func:`_order` (the end sorts after ~ only), digit runs as numbers."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ca = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            cb = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ca != cb:
                return -1 if ca < cb else 1
            i, j = i + 1, j + 1
        si, sj = i, j
        while i < len(a) and a[i].isdigit():
            i += 1
        while j < len(b) and b[j].isdigit():
            j += 1
        na, nb = int(a[si:i] or 0), int(b[sj:j] or 0)
        if na != nb:
            return -1 if na < nb else 1
    return 0


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` sorts before, with or after ``b``."""

    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.partition(":") if ":" in v else ("0", "", v)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), upstream, revision

    (ea, ua, ra), (eb, ub, rb) = split(a), split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def candidates(records: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """Each package's record of highest version, archive records only (with a Filename),
    sorted by package name. Records of one version in several lists (a security update
    later in a point release) are merged: the first one's fields, plus the fields only
    the others have (the security archive's lists carry no debtags)."""
    best: dict[str, dict[str, str]] = {}
    for rec in records:
        name = rec.get("Package")
        if not name or "Filename" not in rec:
            continue
        old = best.get(name)
        if old is None:
            best[name] = {"Version": "0", **rec}
            continue
        order = compare_versions(rec.get("Version", "0"), old["Version"])
        if order > 0:
            best[name] = {"Version": "0", **rec}
        elif order == 0:
            best[name] = {**rec, **old}
    return [best[name] for name in sorted(best)]


def read_packages(lists_dir: str = LISTS, arch: str | None = None) -> list[dict[str, str]]:
    """The candidate record of every binary package of ``arch`` in the lists."""
    kind = f"binary-{arch or native_arch()}_Packages"
    paths = require(index_files(lists_dir, kind), f"*_{kind} lists", lists_dir, FETCH_LISTS)
    return candidates(rec for path in paths for rec in parse_deb822(read_index(path)))


def read_long_descriptions(lists_dir: str = LISTS) -> tuple[dict[str, str], list[str]]:
    """``{Description-md5: long description}`` from the Translation-en files, and the
    names of the files read."""
    paths = require(
        index_files(lists_dir, "i18n_Translation-en"),
        "*_Translation-en lists (the long descriptions)",
        lists_dir,
        FETCH_LISTS,
    )
    long: dict[str, str] = {}
    for path in paths:
        for rec in parse_deb822(read_index(path)):
            if "Description-md5" in rec and "Description-en" in rec:
                long[rec["Description-md5"]] = rec["Description-en"].partition("\n")[2]
    return long, [os.path.basename(p) for p in paths]

"""Training data on any fsspec URL, planned into picklable partitions that workers read.

:func:`open_source` resolves a URL into a :class:`DataSource`: a list of
:class:`Partition` descriptors plus the data set's shape, reading only metadata and each
file's first bytes (its header). :func:`read_partition` reads one partition wherever it
runs, straight from storage. No Dask here: the distributed trainer calls these inside
its tasks. :func:`read_dataset` reads a whole data set into memory (threads).

Inputs (``storage_options`` go to fsspec; for a chained URL such as
``simplecache::s3://...`` plain options are given to the innermost file system):

- one XC text file; a glob (``s3://b/train-*.txt``); or a folder of part files, each a
  complete XC text file with its own header (all with the same N_features and N_labels;
  N_points add up). In a folder, names starting with ``_`` or ``.`` are ignored
  (``_SUCCESS``, ``.crc``) and files are taken in name order; sub-folders are not read.
- a folder written by :func:`dslide_dask.data.convert.convert` (it holds ``manifest.json``):
  one partition per chunk.

Compression follows the extension (``.gz``, ``.bz2``, ``.xz``, ``.zst``; zstd needs the
``zstandard`` package). A compressed file cannot be split: it is one partition. An
uncompressed file larger than ``partition_bytes`` is split into byte ranges: a range owns
the lines that *start* inside it (it reads a little past its end to finish its last
line); the header is in the first range only.

Validation: every problem is an :class:`XCFormatError` naming the URL, the true file line
and the reason. A byte range does not know how many lines precede it, so when one of its
lines is bad it counts them (reading the file up to the range, only then). The header's
N_points can only be checked against a split file once all its ranges are read: readers
of whole epochs (:func:`dslide_dask.data.shuffle.iter_batches`, ``convert``,
:func:`read_dataset`) check with :class:`PointCounter`; or run :func:`index_partitions`
first (one counting pass over the data, on workers through ``map_fn``) to have exact line
numbers and counts up front.
Without an index, blank lines at the end of a split file are padding, not empty points.
``skip_bad_lines`` drops malformed lines and counts them (the first of each partition is
logged); header, point-count and compression errors still raise.

Over 400 lines: planning byte ranges and reading them share the rule of which lines a
range owns, kept in one place.

Caching for multi-epoch runs: prefix the URL with ``simplecache::`` (each worker keeps a
local copy of every file it touches: whole files, even for a byte range) or
``blockcache::`` (keeps only the blocks read); or better, convert the data once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import fsspec
import numpy as np

from dslide_dask.data.binary import plan_chunks, read_chunk
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.partitions import (
    MANIFEST,
    NPZ,
    PARTITION_BYTES,
    TEXT,
    DataSource,
    Partition,
    check_point_counts,
    check_points,
    concat,
    empty_dataset,
    route_options,
)
from dslide_dask.data.xc_text import (
    UNKNOWN_SIZE,
    XCFormatError,
    compression_of,
    decompress,
    parse_header,
    parse_lines,
)
from dslide_dask.kernels import xc_text as K
from dslide_dask.masking import mask_text, masked_errors

log = logging.getLogger(__name__)

_HEAD = 1 << 16  # bytes (raw) read for a header
_LOOKAHEAD = 1 << 16  # bytes read past a range's end to finish its last line
_SCAN = 16 << 20  # bytes a read when counting lines before a range


@masked_errors()  # a storage error names the URL: no credentials
def open_source(
    url: str,
    storage_options: dict | None = None,
    partition_bytes: int = PARTITION_BYTES,
    max_decompressed: int | None = None,
) -> DataSource:
    """Plan reading ``url`` (file, glob, folder of part files, or converted folder); a
    compressed file is refused once it decompresses to over ``max_decompressed`` bytes
    (None: :func:`dslide_dask.data.inflate.default_max_bytes` where it is read)."""
    if partition_bytes < 1:
        raise ValueError(f"partition_bytes must be >= 1, got {partition_bytes}")
    if max_decompressed is not None and max_decompressed < 1:
        raise ValueError(f"max_decompressed must be >= 1 byte, got {max_decompressed}")
    so = route_options(url, storage_options or {})
    fs, path = fsspec.core.url_to_fs(url, **so)
    if fs.isdir(path) and fs.exists(_join(path, MANIFEST)):
        url, path = url.rstrip("/") + "/" + MANIFEST, _join(path, MANIFEST)
    if path.endswith("/" + MANIFEST) or path == MANIFEST:
        return plan_chunks(url, so)
    files = _list_files(fs, url, path, so)
    return _plan_text(fs, url, files, so, partition_bytes, max_decompressed)


@masked_errors()
def read_partition(part: Partition, skip_bad_lines: bool = False) -> tuple[XCDataset, int]:
    """Read one partition from storage: ``(data, number of bad lines skipped)``.

    Raises :class:`XCFormatError` for malformed data (``skip_bad_lines`` turns a bad line
    into a count; a wrong header, wrong point count or corrupt file still raise).
    """
    if part.format == NPZ:
        return read_chunk(part), 0
    fs, path = fsspec.core.url_to_fs(part.url, **part.storage_options)
    if part.whole_file:
        return _read_whole(fs, path, part, skip_bad_lines)
    return _read_range(fs, path, part, skip_bad_lines)


def read_dataset(
    url: str,
    storage_options: dict | None = None,
    *,
    skip_bad_lines: bool = False,
    n_threads: int | None = None,
    max_decompressed: int | None = None,
) -> tuple[XCDataset, int]:
    """A whole data set (any input :func:`open_source` takes) in memory, its partitions
    read by ``n_threads`` threads: ``(data, bad lines skipped)``."""
    src = open_source(url, storage_options, max_decompressed=max_decompressed)
    parts = list(src.partitions)
    with ThreadPoolExecutor(n_threads or min(8, len(parts))) as pool:
        outs = list(pool.map(lambda p: read_partition(p, skip_bad_lines), parts))
    check_point_counts(parts, [len(d) + k for d, k in outs])
    data = concat([d for d, _ in outs], src.n_features, src.n_labels)
    return data, sum(k for _, k in outs)


def index_partitions(
    partitions: Sequence[Partition],
    map_fn: Callable[[Callable, list[Partition]], Iterable[int]] = map,
) -> list[Partition]:
    """Give the byte-range partitions of split files exact line numbers.

    Counts the lines each range owns with ``map_fn(count_lines, ranges)`` (pass a
    function that runs them on workers, e.g. ``lambda f, xs: client.gather(client.map(f,
    xs))``), then checks each file's line count against its header: a file with fewer
    points than its header says fails here, before any training. Reading the returned
    partitions also checks that no point follows the header's N_points.
    """
    todo = [p for p in partitions if not p.whole_file and p.file_lines is None]
    counts = dict(zip(todo, map_fn(count_lines, todo), strict=True))
    totals: dict[str, int] = {}
    for p in todo:
        totals[p.url] = totals.get(p.url, 0) + counts[p]
    out: list[Partition] = []
    line: dict[str, int] = {}
    for p in partitions:
        if p in counts:
            first = line.get(p.url, 1)
            line[p.url] = first + counts[p]
            p = dataclasses.replace(p, first_line=first, file_lines=totals[p.url])
            _check_file_lines(p)
        out.append(p)
    return out


@masked_errors()
def count_lines(part: Partition) -> int:
    """Lines starting in a byte-range partition (the header line included)."""
    fs, path = fsspec.core.url_to_fs(part.url, **part.storage_options)
    buf, a, b = _fetch_range(fs, path, part)
    arr = np.frombuffer(buf, np.uint8)
    return _lines_in(arr, a, b)


# -- planning ----------------------------------------------------------------------------------
def _link_target(fs, path: str) -> dict:
    """What a local link found by a glob or a folder points at (fsspec lists its own type:
    a data file linked into the folder would be skipped unread). A dangling one is an
    error: a part of the data that is not there."""
    try:
        return fs.info(path)  # a path, not a listing entry: the link is followed
    except FileNotFoundError:
        raise FileNotFoundError(mask_text(f"{path}: a link to a missing file")) from None


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


def _list_files(fs, url: str, path: str, so: dict) -> list[tuple[str, str, int]]:
    """``(url, path, size)`` of the data files ``url`` names."""
    pattern = any(c in url.rsplit("::", 1)[-1].split("://", 1)[-1] for c in "*?[")
    if pattern and not fs.exists(path):  # a name such as train[2020].txt is that file
        base = url[: url.rfind("/", 0, min(url.find(c) for c in "*?[" if c in url))]
        infos = fs.glob(path, detail=True)
        what = f"no files match {url}"
    elif fs.isdir(path):
        base = url.rstrip("/")
        infos = {i["name"]: i for i in fs.ls(path, detail=True)}
        what = f"no data files in the folder {url}"
    else:
        return [(url, path, int(fs.info(path)["size"]))]
    _, base_path = fsspec.core.url_to_fs(base, **so)
    base_path = base_path.rstrip("/")
    files = []
    for name, info in sorted(infos.items()):
        if name.rstrip("/").rsplit("/", 1)[-1].startswith(("_", ".")):
            continue
        if info.get("islink"):
            info = _link_target(fs, name)  # a listing describes the link, not its file
        if info.get("type") != "file":
            continue
        if name.startswith(base_path + "/"):
            file_url = base + name[len(base_path) :]
        else:
            file_url = fs.unstrip_protocol(name)
        files.append((file_url, name, int(info["size"])))
    if not files:
        raise FileNotFoundError(mask_text(what))
    return files


def _plan_text(
    fs,
    url: str,
    files: list[tuple[str, str, int]],
    so: dict,
    partition_bytes: int,
    max_decompressed: int | None,
) -> DataSource:
    comps = [compression_of(f[0]) for f in files]
    with ThreadPoolExecutor(min(16, len(files))) as pool:
        heads = list(pool.map(lambda f, c: _read_head(fs, f[0], f[1], f[2], c), files, comps))
    parts: list[Partition] = []
    first = None
    for (file_url, _, size), comp, (n_points, n_features, n_labels) in zip(
        files, comps, heads, strict=True
    ):
        if first is None:
            first = (file_url, n_features, n_labels)
        elif (n_features, n_labels) != first[1:]:
            raise XCFormatError(
                file_url,
                1,
                f"header says {n_features} features and {n_labels} labels but {first[0]} "
                f"says {first[1]} and {first[2]}: the files do not belong together",
            )
        n_parts = 1 if comp or size <= partition_bytes else -(-size // partition_bytes)
        step = -(-size // n_parts)
        for k in range(n_parts):
            parts.append(
                Partition(
                    url=file_url,
                    format=TEXT,
                    n_features=n_features,
                    n_labels=n_labels,
                    n_points=n_points,
                    start=k * step,
                    stop=None if comp else min(size, (k + 1) * step),
                    size=size,
                    compression=comp,
                    part=k,
                    n_parts=n_parts,
                    first_line=1 if n_parts > 1 and k == 0 else None,
                    storage_options=so,
                    max_decompressed=max_decompressed,
                )
            )
    assert first is not None
    total = sum(p.n_points for p in parts if p.part == 0)
    return DataSource(url, TEXT, total, first[1], first[2], tuple(parts))


def _read_head(fs, url: str, path: str, size: int, comp: str | None) -> tuple[int, int, int]:
    """The header (N_points, N_features, N_labels) of a text file, from its first bytes."""
    n = _HEAD
    while True:
        raw = fs.cat_file(path, start=0, end=min(n, size)) if size else b""
        if comp is None:
            return parse_header(raw, url, size)[:3]
        try:
            head = decompress(raw, url, comp, limit=_HEAD)
        except XCFormatError:
            if n < min(size, _SCAN):
                n *= 8  # the prefix was too short (a bzip2 block is up to 900 kB)
                continue
            raise
        # N_points is bounded by the decompressed size, known only if the head is all of it;
        # reading the whole file (_read_whole) checks it against the real size
        whole = len(head) < _HEAD
        return parse_header(head, url, len(head) if whole else UNKNOWN_SIZE)[:3]


# -- reading text ------------------------------------------------------------------------------
def _read_whole(fs, path: str, part: Partition, skip: bool) -> tuple[XCDataset, int]:
    raw = fs.cat_file(path)
    if part.compression:  # bounded, and a trailing flood of blank lines not kept
        buf = decompress(raw, part.url, part.compression, max_bytes=part.max_decompressed)
        del raw  # not held while parsing
    else:
        buf = raw
    header = parse_header(buf, part.url)
    _check_header(part, header[:3])
    parsed = parse_lines(
        buf,
        header[3],
        len(buf),
        part.n_points,
        part.n_features,
        part.n_labels,
        part.url,
        skip_bad_lines=skip,
    )
    if parsed.first_bad:
        log.warning(
            "%s: skipped %d bad line(s), the first: line %d: %s",
            mask_text(part.url),
            parsed.n_skipped,
            parsed.first_bad.line,
            parsed.first_bad.problem,
        )
    return parsed.data, parsed.n_skipped


def _check_header(part: Partition, header: tuple[int, int, int]) -> None:
    planned = (part.n_points, part.n_features, part.n_labels)
    if header != planned:
        raise XCFormatError(
            part.url,
            1,
            f"header is now {' '.join(map(str, header))} but was "
            f"{' '.join(map(str, planned))} when the data were planned (file replaced?)",
        )


def _fetch_range(fs, path: str, part: Partition) -> tuple[bytes, int, int]:
    """``(buf, a, b)``: bytes from ``max(0, start - 1)`` on, in which ``buf[a:b]`` are the
    lines starting in ``[start, stop)`` (a == b: none)."""
    assert part.size is not None and part.stop is not None
    lo = max(0, part.start - 1)
    hi = min(part.size, part.stop + _LOOKAHEAD)
    buf = fs.cat_file(path, start=lo, end=hi)
    arr = np.frombuffer(buf, np.uint8)
    if part.start == 0:
        a = 0
    else:  # the first line start at or after `start`: just after a newline at >= start - 1
        nl = K.find_byte(arr, 0, part.stop - lo - 1, K._LF)
        if nl < 0:
            return buf, 0, 0  # a line spans the whole range
        a = nl + 1
    end = part.stop - lo - 1  # our last line holds byte stop - 1: find its end
    while True:
        nl = K.find_byte(arr, end, len(arr), K._LF)
        if nl >= 0:
            return buf, a, nl + 1
        if lo + len(buf) >= part.size:
            return buf, a, len(buf)
        end = len(buf)
        buf += _more(fs, path, part, lo + len(buf), min(part.size, lo + 2 * len(buf)))
        arr = np.frombuffer(buf, np.uint8)


def _more(fs, path: str, part: Partition, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the file, which must still be there."""
    more = fs.cat_file(path, start=start, end=end)
    if not more:
        raise XCFormatError(
            part.url, None, f"the file ends at byte {start}, but had {part.size} bytes when planned"
        )
    return more


def _lines_in(arr: np.ndarray, a: int, b: int) -> int:
    """Lines starting in ``arr[a:b]`` (which ends at a line end or the file end)."""
    return K.count_lines(arr, a, b) + int(b > a and arr[b - 1] != K._LF)


def _read_range(fs, path: str, part: Partition, skip: bool) -> tuple[XCDataset, int]:
    buf, a, b = _fetch_range(fs, path, part)
    if a == b:
        return empty_dataset(part.n_features, part.n_labels), 0
    lo = max(0, part.start - 1)
    arr = np.frombuffer(buf, np.uint8)
    first_line = part.first_line
    if part.part == 0:  # the header line
        header = parse_header(buf, part.url, part.size)
        _check_header(part, header[:3])
        a = header[3]
        first_line = 2
    elif first_line is None:
        first_line = 1  # relative to the range: made absolute only for an error message
    if part.file_lines is not None:  # indexed: lines after N_points must be blank
        n_points = max(0, min(first_line + _lines_in(arr, a, b), part.n_points + 2) - first_line)
    else:  # not indexed: trailing blank lines of the file are not points
        if _only_blanks_after(fs, path, part, buf, b):
            last = K.last_non_blank(arr, a, b)
            nl = K.find_byte(arr, last, b, K._LF) if last >= 0 else -1
            b = a if last < 0 else (nl + 1 if nl >= 0 else b)
        n_points = _lines_in(arr, a, b)
    known = part.part == 0 or part.first_line is not None
    parsed = parse_lines(
        buf,
        a,
        b,
        n_points,
        part.n_features,
        part.n_labels,
        part.url,
        first_line=first_line,
        skip_bad_lines=skip,
        header_points=part.n_points,
        locate=None if known else lambda line: line + _lines_before(fs, path, lo + a),
    )
    if parsed.first_bad:
        where = (
            f"line {parsed.first_bad.line}"
            if known
            else (f"line {parsed.first_bad.line} of the range from byte {lo + a}")
        )
        log.warning(
            "%s: skipped %d bad line(s), the first: %s: %s",
            mask_text(part.url),
            parsed.n_skipped,
            where,
            parsed.first_bad.problem,
        )
    if part.file_lines is not None and part.stop == part.size:
        _check_file_lines(part)
    return parsed.data, parsed.n_skipped


def _only_blanks_after(fs, path: str, part: Partition, buf: bytes, b: int) -> bool:
    """Whether only blanks follow ``buf[:b]`` up to the end of the file."""
    assert part.size is not None
    lo = max(0, part.start - 1)
    arr = np.frombuffer(buf, np.uint8)
    if K.last_non_blank(arr, b, len(arr)) >= 0:
        return False
    pos = lo + len(buf)
    while pos < part.size:
        more = np.frombuffer(_more(fs, path, part, pos, min(part.size, pos + _SCAN)), np.uint8)
        if K.last_non_blank(more, 0, len(more)) >= 0:
            return False
        pos += len(more)
    return True


def _lines_before(fs, path: str, offset: int) -> int:
    """Newlines in the file's first ``offset`` bytes (read in chunks)."""
    n = 0
    for pos in range(0, offset, _SCAN):
        chunk = fs.cat_file(path, start=pos, end=min(offset, pos + _SCAN))
        n += K.count_lines(np.frombuffer(chunk, np.uint8), 0, len(chunk))
    return n


def _check_file_lines(part: Partition) -> None:
    """A file of ``file_lines`` lines holds at most ``file_lines - 1`` points."""
    assert part.file_lines is not None
    if part.file_lines - 1 < part.n_points:
        check_points(part.url, part.file_lines - 1, part.n_points)

"""Read and write the Extreme Classification Repository text format from any fsspec URL.

Format: a header line ``N_points N_features N_labels``, then one line a point:
``l1,l2,...,lk f:v f:v ...`` with 0-based ids (a point without labels starts with a
blank). Parsing and formatting run in numba kernels over whole byte buffers; a malformed
file raises :class:`XCFormatError` naming the source, the 1-based line and the problem.
Values are written with 6 significant digits. :func:`parse_lines` parses any run of lines
(a byte range of a big file: see :mod:`dslide_dask.data.source`), optionally skipping
bad lines.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.errors import XCFormatError
from dslide_dask.kernels import xc_text as K
from dslide_dask.masking import masked_errors

_INT32_MAX = np.iinfo(np.int32).max
#: The most points a data set may declare: a run's steps are counted in 40 bits (the lr
#: schedule's lengths), and a header past it (2**63 in a compressed file, whose size
#: cannot bound it) would otherwise surface as a schedule parameter out of range.
MAX_POINTS = 1 << 40
_WRITE_ROWS = 16384  # rows formatted per kernel call when writing
_MAX_HEADER = 1024  # bytes of line 1 looked at
_ZSTD_EXTENSIONS = ("zst", "zstd")
#: ``parse_header(size=UNKNOWN_SIZE)``: the file's size is not known (the head of a
#: compressed stream), so N_points cannot be bounded yet.
UNKNOWN_SIZE = -1


@masked_errors()  # a storage error names the URL: no credentials
def read_xc(url: str, storage_options: dict | None = None) -> XCDataset:
    """Read an XC text file from a local path or fsspec URL (compression inferred).

    Parameters
    ----------
    url : str
        The file (``.gz``, ``.bz2``, ``.xz`` or ``.zst`` by extension: compressed).
    storage_options : dict or None, default=None
        fsspec options of ``url`` (credentials, endpoint...).

    Returns
    -------
    XCDataset
        Its points: features ``X`` and labels ``Y``.

    Raises
    ------
    XCFormatError
        ``url:line: problem`` for the first line that is not valid XC text.
    """
    import fsspec

    with fsspec.open(url, "rb", **(storage_options or {})) as f:
        buf = f.read()
    comp = compression_of(url)
    return parse_xc(decompress(buf, url, comp) if comp else buf, source=url)


def compression_of(url: str) -> str | None:
    """fsspec's compression name for ``url``'s extension (None: not compressed)."""
    import fsspec

    ext = url.rsplit(".", 1)[-1].lower() if "." in url.rsplit("/", 1)[-1] else ""
    if ext in _ZSTD_EXTENSIONS:
        if "zstd" not in fsspec.compression.compr:
            raise ImportError(
                f"{url} is zstd-compressed: reading it needs the zstandard package "
                "(pip install zstandard)"
            )
        return "zstd"
    return fsspec.utils.infer_compression(url)


def decompress(
    raw: bytes, url: str, comp: str, limit: int = -1, max_bytes: int | None = None
) -> bytes:
    """``raw`` decompressed (its first ``limit`` bytes if >= 0; else all of it, within
    ``max_bytes``: :func:`dslide_dask.data.inflate.inflate`); corrupt streams raise
    :class:`XCFormatError`."""
    import fsspec

    from dslide_dask.data.archives import zip_members, zstd_cut
    from dslide_dask.data.inflate import inflate

    if comp == "zip" and (problem := zip_members(raw)):  # else the first file, silently
        raise XCFormatError(url, None, problem)
    try:
        opened = lambda: fsspec.compression.compr[comp](io.BytesIO(raw), mode="rb")  # noqa: E731
        with opened() as f:
            if limit >= 0:
                out = f.read(limit)
            else:
                out = inflate(f, max_bytes, opened, lambda what: XCFormatError(url, None, what))
        whole = limit < 0 or len(out) < limit  # read to its end: a cut shows
        if comp == "zstd" and whole and (problem := zstd_cut(raw)):  # else silent
            raise XCFormatError(url, None, problem)
        return out
    except XCFormatError:
        raise
    except EOFError as err:
        raise XCFormatError(url, None, f"truncated {comp} stream ({err})") from None
    except MemoryError:
        raise
    except Exception as err:  # zlib.error, lzma.LZMAError, OSError, ZstdError, ...
        detail = str(err) or type(err).__name__
        raise XCFormatError(url, None, f"not a valid {comp} file ({detail})") from None


def parse_xc(buf: bytes, source: str = "<bytes>") -> XCDataset:
    """Parse the bytes of an XC text file; ``source`` names it in error messages."""
    n_points, n_features, n_labels, body = parse_header(buf, source)
    return parse_lines(buf, body, len(buf), n_points, n_features, n_labels, source).data


@dataclass(frozen=True)
class BadLine:
    """A line dropped by ``skip_bad_lines``: its line number and what is wrong with it."""

    line: int
    problem: str


@dataclass(frozen=True)
class ParsedLines:
    """What :func:`parse_lines` found: the points, and the bad lines it skipped."""

    data: XCDataset
    n_skipped: int = 0
    first_bad: BadLine | None = None


def parse_lines(
    buf: bytes,
    start: int,
    stop: int,
    n_points: int,
    n_features: int,
    n_labels: int,
    source: str,
    *,
    first_line: int = 2,
    skip_bad_lines: bool = False,
    locate: Callable[[int], int] | None = None,
    header_points: int | None = None,
) -> ParsedLines:
    """Parse ``n_points`` lines of ``buf[start:stop]`` (numbered from ``first_line``);
    only blank lines may follow them.

    A bad line raises :class:`XCFormatError` naming ``source`` and the line number, passed
    through ``locate`` first if given (e.g. range-relative -> file line number, computed
    only when needed). With ``skip_bad_lines`` bad lines are dropped and counted instead;
    a point count that disagrees with ``n_points`` is an error either way. Messages quote
    ``header_points`` (default ``n_points``) as the header's N_points.
    """
    arr = np.frombuffer(buf, dtype=np.uint8)[:stop]
    colons, commas, lines = K.count_bytes(arr, start)
    x_indptr, x_idx, x_val, y_indptr, y_idx, err, bad, n_bad = K.parse_lines(
        arr,
        start,
        n_points,
        n_features,
        n_labels,
        colons,
        commas + lines + 1,
        first_line,
        skip_bad_lines,
    )
    locate = locate or (lambda line: line)
    shape = (n_points if header_points is None else header_points, n_features, n_labels)
    if err[0] == K.ERR_EXTRA and err[4] > 0:  # a blank line mid-file made the extra point
        raise XCFormatError(
            source,
            locate(int(err[4])),
            f"blank line in the middle of the file: it is read as a point without labels or "
            f"features, so the file has more points than the header's N_points = {shape[0]} "
            f"(the first extra one on line {locate(int(err[1]))})",
        )
    if err[0] != K.OK:
        text = memoryview(buf)[:stop]  # no copy of the text (as big as the memory allows)
        raise XCFormatError(source, locate(int(err[1])), _problem(text, err, *shape))
    first_bad = None
    if n_bad:
        first_bad = BadLine(int(bad[1]), _problem(memoryview(buf)[:stop], bad, *shape))
    X = CSR(x_indptr, x_idx, x_val, n_features)
    Y = CSR(y_indptr, y_idx, None, n_labels)
    return ParsedLines(XCDataset(X, Y), int(n_bad), first_bad)


def write_xc(url: str, data: XCDataset, storage_options: dict | None = None) -> None:
    """Write ``data`` as XC text to a local path or fsspec URL (compression inferred).

    Parameters
    ----------
    url : str
        The file to write (compressed by its extension, as :func:`read_xc` reads it).
    data : XCDataset
        The points.
    storage_options : dict or None, default=None
        fsspec options of ``url``.
    """
    import fsspec

    X, Y = data.X, data.Y
    x_val = X.values()
    _check_writable(X, Y, x_val)
    header = f"{data.n_points} {data.n_features} {data.n_labels}\n".encode()
    so = storage_options or {}
    fs, path = fsspec.core.url_to_fs(url, **so)
    if "file" in fs.protocol:  # local: create the folder, as object stores do
        fs.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with fsspec.open(url, "wb", compression="infer", **so) as f:
        f.write(header)
        for lo in range(0, data.n_points, _WRITE_ROWS):
            hi = min(lo + _WRITE_ROWS, data.n_points)
            f.write(K.format_rows(X.indptr, X.indices, x_val, Y.indptr, Y.indices, lo, hi))


def _check_writable(X: CSR, Y: CSR, x_val: np.ndarray) -> None:
    for name, m in (("feature", X), ("label", Y)):
        if m.nnz and (m.indices.min() < 0 or m.indices.max() >= m.n_cols):
            raise ValueError(f"{name} ids must be in [0, {m.n_cols}) to be written")
    if len(x_val) and not np.isfinite(x_val).all():
        raise ValueError("feature values must be finite to be written")


#: leading bytes of compressed streams, for a clear error when a file's name hides one
MAGIC = {
    b"\x1f\x8b": ("gzip", ".gz"),
    b"BZh": ("bzip2", ".bz2"),
    b"\xfd7zXZ\x00": ("xz", ".xz"),
    b"\x28\xb5\x2f\xfd": ("zstd", ".zst"),
    b"PK\x03\x04": ("zip", ".zip"),
}


_BOMS = {b"\xef\xbb\xbf": "UTF-8", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def parse_header(buf: bytes, source: str, size: int | None = None) -> tuple[int, int, int, int]:
    """(n_points, n_features, n_labels, byte offset of line 2) from the start of a file.

    ``buf`` may be just the file's first bytes if ``size`` (the whole file's, when known)
    is given: it bounds N_points (a point takes at least one byte). ``UNKNOWN_SIZE``: no
    bound yet (the first bytes of a compressed stream).
    """
    for bom, what in _BOMS.items():
        if buf.startswith(bom):
            raise XCFormatError(
                source,
                1,
                f"the file starts with a {what} byte-order mark (BOM): "
                "save it as plain ASCII/UTF-8 text without a BOM",
            )
    if re.match(rb"\s*\Z", buf):  # stops at the first non-blank byte: no copy
        raise XCFormatError(
            source, 1, "empty file (expected header 'N_points N_features N_labels')"
        )
    end = buf.find(b"\n", 0, _MAX_HEADER)
    if end < 0:
        end = len(buf) if len(buf) <= _MAX_HEADER else _MAX_HEADER
    text = buf[:end].decode("utf-8", errors="replace")
    parts = text.split()
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
        compressed = next((v for m, v in MAGIC.items() if buf.startswith(m)), None)
        if compressed:
            raise XCFormatError(
                source,
                None,
                f"this is {compressed[0]}-compressed data, but the name does not say so "
                f"(name it *{compressed[1]} to have it decompressed)",
            )
        raise XCFormatError(
            source,
            1,
            f"header must be 3 non-negative integers 'N_points N_features N_labels', "
            f"got {_quote(text.strip())}",
        )
    n_points, n_features, n_labels = (int(p) for p in parts)
    if n_points > MAX_POINTS:
        raise XCFormatError(
            source, 1, f"header N_points {_digits(parts[0])} exceeds the supported {MAX_POINTS:,}"
        )
    for name, v in (("N_features", n_features), ("N_labels", n_labels)):
        if v > _INT32_MAX:
            raise XCFormatError(
                source, 1, f"header {name} {_digits(str(v))} exceeds the int32 limit"
            )
    size = len(buf) if size is None else size
    if size != UNKNOWN_SIZE and n_points > size:
        raise XCFormatError(
            source,
            1,
            f"header N_points {_digits(str(n_points))} exceeds the file size ({size} bytes)",
        )
    return n_points, n_features, n_labels, min(end + 1, len(buf))


def _digits(s: str, limit: int = 24) -> str:
    """A number from the file as it is, or its first digits and its length if long: a
    100 MB id must not become a 100 MB error line."""
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s):,} digits)"


def _quote(s: str, limit: int = 40) -> str:
    return repr(s if len(s) <= limit else s[:limit] + "...")


def _problem(
    buf: bytes | memoryview, err: np.ndarray, n_points: int, n_features: int, n_labels: int
) -> str:
    code, line, t0, t1, value, f0, f1 = (int(v) for v in err)
    tok = bytes(buf[t0:t1]).decode("utf-8", errors="replace")
    if code == K.ERR_FEW_POINTS:
        return f"the file ends after {value} point(s) but the header says N_points = {n_points}"
    if code == K.ERR_EXTRA:
        return f"more points than the header's N_points = {n_points} (found {_quote(tok)})"
    if code == K.ERR_LABEL_TOKEN:
        msg = _label_token_problem(tok, bytes(buf[f0:f1]).decode("utf-8", errors="replace"))
    elif code == K.ERR_LABEL_RANGE:
        msg = f"label id {_digits(tok)} >= n_labels {n_labels}"
    elif code == K.ERR_LABEL_DUP:
        msg = f"duplicate label id {value}"
    elif code == K.ERR_FEATURE_TOKEN:
        msg = _feature_token_problem(tok)
    elif code == K.ERR_FEATURE_RANGE:
        msg = f"feature id {_digits(tok)} >= n_features {n_features}"
    elif code == K.ERR_VALUE:
        msg = _value_problem(tok)
    elif code == K.ERR_VALUE_OVERFLOW:
        msg = (
            f"value in feature {_quote(tok)} overflows float32 arithmetic (values must be "
            f"in [-{K.VALUE_MAX:.0e}, {K.VALUE_MAX:.0e}]: scale the data)"
        )
    elif code == K.ERR_FEATURE_DUP:
        msg = f"duplicate feature id {value}"
    else:  # pragma: no cover - kernel and messages out of sync
        msg = f"parse error code {code}"
    truncatable = (K.ERR_LABEL_TOKEN, K.ERR_FEATURE_TOKEN, K.ERR_VALUE)
    if code in truncatable and t1 >= len(buf) and bytes(buf[-1:]) != b"\n":
        msg += " (the file ends mid-line: truncated?)"
    return msg


def _is_int(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _label_token_problem(tok: str, field: str) -> str:
    if ":" in field:
        return (
            f"expected comma-separated label ids, got {_quote(field)} "
            "(a point without labels must start with a blank)"
        )
    if tok == "":
        return f"empty label id in {_quote(field)}"
    if tok.startswith("-") and _is_int(tok[1:]):
        return f"negative label id {_digits(tok)}"
    return f"label id {_quote(tok)} is not a non-negative integer"


def _feature_token_problem(tok: str) -> str:
    if ":" not in tok:
        return f"malformed feature {_quote(tok)} (expected id:value)"
    fid = tok.split(":", 1)[0]
    if fid == "":
        return f"missing feature id in {_quote(tok)}"
    if fid.startswith("-") and _is_int(fid[1:]):
        return f"negative feature id {_digits(fid)}"
    return f"feature id {_quote(fid)} is not a non-negative integer"


def _value_problem(tok: str) -> str:
    val = tok.split(":", 1)[1] if ":" in tok else ""
    if val == "":
        return f"empty value in feature {_quote(tok)}"
    if val.lstrip("+-").lower() in ("nan", "inf", "infinity"):
        return f"non-finite value {_quote(val)} in feature {_quote(tok)}"
    return f"bad value {_quote(val)} in feature {_quote(tok)}"

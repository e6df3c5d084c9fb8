"""The converted layout: XC data as chunks of compact arrays, read much faster than text.

A converted data set (:func:`dslide_dask.data.convert.convert` writes one) is a folder
(any fsspec URL) holding ``manifest.json`` and
``chunk-000000.npz``, ... Each chunk is an uncompressed ``.npz`` (``np.load`` opens it)
of ``chunk_points`` rows, coded without loss by :mod:`dslide_dask.kernels.chunk_codec`:

====================  =============  ==================================================
``x_counts``          uint16/uint32  features of each row
``x_deltas``          uint16         feature id minus the previous one of its row
``x_id_escapes``      int32          whole ids where a difference did not fit
``x_digits``          uint16         low 16 bits of the decimal significand of a value
``x_scale``           uint8          its high 4 bits and power of ten (15: raw value)
``x_raw_values``      float32        values with no short decimal form
``y_counts``          uint16/uint32  labels of each row
``y_indices``         int32          label ids
====================  =============  ==================================================

The manifest is written last::

    {"format": "dslide-xc-chunks", "version": 2, "n_points": ..., "n_features": ...,
     "n_labels": ..., "chunks": [{"file": "chunk-000000.npz", "n_points": ...,
     "nnz": ..., "n_label_ids": ..., "bytes": ...}, ...], "source": ..., ...}

Why these codes: reading is bound by storage GETs, and they make a chunk about a third
smaller than raw CSR arrays (version 1) for little decoding work; a general compressor
gains little more on the ids and values (their low bits are noise) and would add a
dependency. One uncompressed npz a chunk: one GET, in a file anyone can open; Parquet
would need pyarrow for a few flat columns. docs/benchmarks.md has the figures.

Reading checks the manifest and every chunk (size, array names, dtypes, lengths, counts,
ids within bounds, escapes used exactly, finite values): problems raise
:class:`XCFormatError` naming the chunk's URL.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile

import fsspec
import numpy as np

from dslide_dask.data.csr import CSR, MAX_COLS
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.partitions import MANIFEST, NPZ, DataSource, Partition
from dslide_dask.data.xc_text import MAX_POINTS, XCFormatError
from dslide_dask.kernels import chunk_codec as codec
from dslide_dask.paths import inside

FORMAT = "dslide-xc-chunks"
VERSION = 2
CHUNK_POINTS = 65536
_U16, _U32 = np.dtype(np.uint16), np.dtype(np.uint32)
#: array name -> the dtypes it may have, in file order
ARRAYS: dict[str, tuple[np.dtype, ...]] = {
    "x_counts": (_U16, _U32),
    "x_deltas": (_U16,),
    "x_id_escapes": (np.dtype(np.int32),),
    "x_digits": (_U16,),
    "x_scale": (np.dtype(np.uint8),),
    "x_raw_values": (np.dtype(np.float32),),
    "y_counts": (_U16, _U32),
    "y_indices": (np.dtype(np.int32),),
}


def plan_chunks(manifest_url: str, storage_options: dict) -> DataSource:
    """The partitions (one per chunk) of a converted data set, from its manifest."""
    with fsspec.open(manifest_url, "rb", **storage_options) as f:
        raw = f.read()
    m = _check_manifest(raw, manifest_url)
    base = manifest_url[: -len(MANIFEST)]
    for c in m["chunks"]:  # a chunk is a file of this folder, never one elsewhere
        inside(base, c["file"], manifest_url)
    parts = tuple(
        Partition(
            url=base + c["file"],
            format=NPZ,
            n_features=m["n_features"],
            n_labels=m["n_labels"],
            n_points=c["n_points"],
            size=c["bytes"],
            storage_options=storage_options,
        )
        for c in m["chunks"]
    )
    return DataSource(manifest_url, NPZ, m["n_points"], m["n_features"], m["n_labels"], parts)


def read_chunk(part: Partition) -> XCDataset:
    """One chunk of the converted layout, decoded and validated."""
    fs, path = fsspec.core.url_to_fs(part.url, **part.storage_options)
    try:
        size = fs.size(path)
    except FileNotFoundError:
        raise XCFormatError(part.url, None, "chunk file missing (the manifest names it)") from None
    if part.size is not None and size != part.size:  # before reading it all
        raise XCFormatError(
            part.url,
            None,
            f"chunk has {size} bytes but the manifest says {part.size} (truncated or replaced?)",
        )
    buf = fs.cat_file(path)
    if part.size is not None and len(buf) != part.size:
        raise XCFormatError(
            part.url,
            None,
            f"chunk has {len(buf)} bytes but the manifest says {part.size} "
            "(truncated or replaced?)",
        )
    a = _npz_arrays(buf, part.url)

    def bad(problem: str) -> XCFormatError:
        return XCFormatError(part.url, None, problem)

    def indptr(name: str, n_ids: int, what: str) -> np.ndarray:
        counts = a[name]
        if len(counts) != part.n_points:
            raise bad(f"{name} has {len(counts)} entries for {part.n_points} points")
        out = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=out[1:])
        if out[-1] != n_ids:
            raise bad(f"{name} adds up to {out[-1]} {what} ids but there are {n_ids}")
        return out

    def check(status: tuple[int, int, int], codes: str, escapes: str, what: str) -> None:
        code, pos, value = status
        if code == codec.ERR_SHAPE:
            raise bad(f"{codes} does not fit the other arrays")
        if code == codec.ERR_ESCAPES_SHORT:
            raise bad(f"{codes}[{pos}] is an escape but {escapes} is used up")
        if code == codec.ERR_ESCAPES_LEFT:
            raise bad(f"{escapes} has {value} entries that no code refers to")
        if code == codec.ERR_ID_RANGE:
            n = part.n_features if what == "feature" else part.n_labels
            raise bad(f"{what} id {value} out of range [0, {n})")

    x_indptr = indptr("x_counts", len(a["x_deltas"]), "feature")
    ids = np.empty(len(a["x_deltas"]), np.int32)
    status = codec.decode_ids(x_indptr, a["x_deltas"], a["x_id_escapes"], part.n_features, ids)
    check(status, "x_deltas", "x_id_escapes", "feature")
    if not len(a["x_digits"]) == len(a["x_scale"]) == len(ids):
        raise bad(
            f"x_digits has {len(a['x_digits'])} entries and x_scale {len(a['x_scale'])} "
            f"for {len(ids)} feature ids"
        )
    values = np.empty(len(ids), np.float32)
    status = codec.decode_values(a["x_digits"], a["x_scale"], a["x_raw_values"], values)
    check(status, "x_scale", "x_raw_values", "value")
    if not np.isfinite(a["x_raw_values"]).all():
        raise bad("x_raw_values holds non-finite values")
    labels = a["y_indices"].copy()  # the other arrays are views of ``buf``
    if len(labels) and (labels.min() < 0 or labels.max() >= part.n_labels):
        v = int(labels.min()) if labels.min() < 0 else int(labels.max())
        raise bad(f"label id {v} out of range [0, {part.n_labels})")
    y_indptr = indptr("y_counts", len(labels), "label")
    X = CSR(x_indptr, ids, values, part.n_features)
    Y = CSR(y_indptr, labels, None, part.n_labels)
    return XCDataset(X, Y)


def _encode(data: XCDataset) -> dict[str, np.ndarray]:
    """The arrays of a chunk holding ``data`` (see the module docstring)."""
    X, Y = data.X, data.Y
    x_deltas, x_id_escapes = codec.encode_ids(X.indptr, X.indices)
    x_digits, x_scale, x_raw_values = codec.encode_values(X.values().astype(np.float32, copy=False))

    def counts(indptr: np.ndarray) -> np.ndarray:
        c = np.diff(indptr)
        return c.astype(_U16 if len(c) == 0 or c.max() <= 0xFFFF else _U32)

    return {
        "x_counts": counts(X.indptr),
        "x_deltas": x_deltas,
        "x_id_escapes": x_id_escapes,
        "x_digits": x_digits,
        "x_scale": x_scale,
        "x_raw_values": x_raw_values,
        "y_counts": counts(Y.indptr),
        "y_indices": Y.indices.astype(np.int32, copy=False),
    }


def npz_bytes(data: XCDataset) -> bytes:
    out = io.BytesIO()
    np.savez(out, **_encode(data))  # type: ignore[arg-type]  # array names, no allow_pickle
    return out.getvalue()


def _npz_arrays(buf: bytes, url: str) -> dict[str, np.ndarray]:
    """Views of the arrays of a stored (uncompressed) npz in ``buf``, found through the
    zip directory (no CRC pass: the arrays are checked instead)."""
    try:
        with zipfile.ZipFile(io.BytesIO(buf)) as z:
            infos = {i.filename: i for i in z.infolist()}
    except (zipfile.BadZipFile, NotImplementedError, ValueError) as err:
        raise XCFormatError(url, None, f"not a valid npz chunk ({err})") from None
    names = sorted(n.removesuffix(".npy") for n in infos)
    if names != sorted(ARRAYS):
        raise XCFormatError(url, None, f"chunk holds arrays {names}, expected {sorted(ARRAYS)}")
    out = {}
    for name, dtypes in ARRAYS.items():
        info = infos[name + ".npy"]
        if info.compress_type != zipfile.ZIP_STORED:
            raise XCFormatError(url, None, f"{name} is compressed: chunks must be stored")
        try:
            n_name, n_extra = struct.unpack_from("<HH", buf, info.header_offset + 26)
            pos = info.header_offset + 30 + n_name + n_extra
            f = io.BytesIO(buf[pos : pos + min(info.file_size, 1 << 16)])
            version = np.lib.format.read_magic(f)
            shape, fortran, got = (
                np.lib.format.read_array_header_1_0(f)
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0(f)
            )
        except MemoryError:
            raise
        except Exception as err:  # numpy parses the header as Python: TokenError, SyntaxError
            detail = str(err) or type(err).__name__
            raise XCFormatError(url, None, f"{name} is not a valid .npy array ({detail})") from None
        if got not in dtypes or len(shape) != 1:
            allowed = " or ".join(str(d) for d in dtypes)
            raise XCFormatError(
                url, None, f"{name} is {got}{list(shape)}, expected a 1-D {allowed} array"
            )
        count = shape[0]
        if f.tell() + count * got.itemsize != info.file_size:
            raise XCFormatError(url, None, f"{name} has the wrong size")
        out[name] = np.frombuffer(buf, got, count, pos + f.tell())
    return out


def _check_manifest(raw: bytes, url: str) -> dict:
    def bad(problem: str) -> XCFormatError:
        return XCFormatError(url, None, problem)

    try:
        m = json.loads(raw)
    except ValueError as err:
        raise bad(f"not valid JSON ({err})") from None
    except RecursionError:
        raise bad("not valid JSON (nested too deeply)") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} manifest")
    if m.get("version") != VERSION:
        raise bad(
            f"format version {m.get('version')!r}, this reader knows {VERSION} "
            "(convert the text again with `dslide convert`)"
        )

    def count(d: dict, key: str, where: str, lo: int = 0, hi: int = MAX_POINTS) -> int:
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise bad(f"{where}{key} must be an integer >= {lo}, got {v!r:.40}")
        if v > hi:
            raise bad(f"{where}{key} must be an integer <= {hi} (the supported most), got {v}")
        return v

    count(m, "n_points", "")
    for key in ("n_features", "n_labels"):
        count(m, key, "", lo=1, hi=MAX_COLS)
    chunks = m.get("chunks")
    if not isinstance(chunks, list):
        raise bad("chunks must be a list")
    for i, c in enumerate(chunks):
        if not isinstance(c, dict):
            raise bad(f"chunks[{i}] must be an object")
        name = c.get("file")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise bad(f"chunks[{i}].file must be a file name in the folder, got {name!r}")
        for key in ("n_points", "nnz", "n_label_ids", "bytes"):
            count(c, key, f"chunks[{i}].")
    total = sum(c["n_points"] for c in chunks)
    if total != m["n_points"]:
        raise bad(f"chunks hold {total} points but n_points is {m['n_points']}")
    return m

"""Training data in the converted layout (``dslide convert``: a manifest and npz chunks
of compact codes): the round trip, exact ids and float32 bit patterns, a failed
conversion that leaves no manifest, and damaged chunks and manifests, each refused with
the file and the problem named.
"""

from __future__ import annotations

import io
import json

import fsspec
import numpy as np
import pytest

from dslide_dask.data import CSR, XCDataset, XCFormatError, write_xc
from dslide_dask.data.binary import _encode
from dslide_dask.data.convert import convert
from dslide_dask.data.partitions import Partition
from dslide_dask.data.shuffle import iter_batches
from dslide_dask.data.source import open_source, read_partition
from tests.storage import assert_same, numbered, put, read_all, row_ids


@pytest.fixture(scope="module")
def data() -> XCDataset:
    """600 numbered rows (tests.storage.numbered), seed 1."""
    return numbered(600, seed=1)


# -- converted layout --------------------------------------------------------------------------
def test_convert_round_trip_and_manifest(tmp_path, data: XCDataset) -> None:
    write_xc(str(tmp_path / "train.txt.gz"), data)
    out = tmp_path / "bin"
    s = convert(str(tmp_path / "train.txt.gz"), str(out), chunk_points=128)
    assert (s.n_points, s.n_chunks, s.n_skipped) == (600, 5, 0)
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == "dslide-xc-chunks" and m["version"] == 2
    assert [c["n_points"] for c in m["chunks"]] == [120] * 5  # equal chunks of <= 128
    assert (m["n_points"], m["n_features"], m["n_labels"]) == (600, 300, 50)
    for url in (str(out), str(out / "manifest.json")):
        src = open_source(url)
        assert src.format == "npz" and len(src.partitions) == 5
        assert_same(read_all(src)[0], data)
    with np.load(out / "chunk-000001.npz") as z:  # plain numpy can read a chunk
        assert z["x_counts"].sum() == len(z["x_deltas"]) == len(z["x_digits"])
    ids = np.concatenate([row_ids(b) for b in iter_batches(src.partitions, 100, 0, 0, 200)])
    assert np.array_equal(np.sort(ids), np.arange(600))
    with pytest.raises(ValueError, match="already converted"):
        convert(str(out), str(tmp_path / "again"))


def test_chunk_codes_are_exact() -> None:
    """Every id and every float32 bit pattern comes back: unsorted rows, gaps over 65,535,
    a row of 70,000 ids, values with many digits, negative, -0.0, tiny and huge."""
    rng = np.random.default_rng(0)
    rows = [rng.choice(200_000, size=n, replace=False) for n in rng.integers(0, 40, 300)]
    rows += [np.array([199_999, 0, 65_535, 65_534 + 65_535]), np.arange(70_000)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    ids = np.concatenate(rows).astype(np.int32)
    values = np.concatenate(
        [
            np.float32([0.0, -0.0, 1.0, 0.1, 0.0438553, 1e-30, 3e38, -2.5, 1234567.0, 0.123456789]),
            rng.random(len(ids) - 10, dtype=np.float32),
        ]
    )
    values[10:1000] = np.round(values[10:1000], 4)  # short decimals, as XC text has
    d = XCDataset(
        CSR(indptr, ids, values, 200_000),
        CSR(np.arange(len(rows) + 1), np.arange(len(rows)) % 7, None, 7),
    )
    a = _encode(d)
    assert a["x_counts"].dtype == np.uint32 and a["y_counts"].dtype == np.uint16
    assert 0 < len(a["x_id_escapes"]) < len(ids) // 10
    assert 0 < len(a["x_raw_values"]) < len(values) - 990
    put("memory://codes/chunk-000000.npz", _chunk_bytes(d))
    got = read_partition(
        Partition("memory://codes/chunk-000000.npz", "npz", 200_000, 7, n_points=len(rows))
    )[0]
    assert np.array_equal(got.X.indptr, indptr) and np.array_equal(got.X.indices, ids)
    assert np.array_equal(got.X.data.view(np.uint32), values.view(np.uint32))
    assert np.array_equal(got.Y.indices, d.Y.indices)


def test_convert_failure_leaves_no_manifest(tmp_path) -> None:
    put(str(tmp_path / "bad.txt"), b"2 10 5\n1 1:1\n1 11:1\n")
    with pytest.raises(XCFormatError, match=":3: feature id 11 >= n_features 10"):
        convert(str(tmp_path / "bad.txt"), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "manifest.json").exists()
    s = convert(str(tmp_path / "bad.txt"), str(tmp_path / "out"), skip_bad_lines=True)
    assert (s.n_points, s.n_skipped) == (1, 1)


def _chunk_bytes(d: XCDataset, **replace) -> bytes:
    arrays = {**_encode(d), **replace}
    buf = io.BytesIO()
    np.savez(buf, **{k: v for k, v in arrays.items() if v is not None})
    return buf.getvalue()


CHUNK = "memory://badbin/chunk-000000.npz"
U16, I32 = np.uint16, np.int32
BAD_CHUNKS = {
    "counts-short": (dict(x_counts=np.ones(4, U16)), "x_counts has 4 entries for 5 points"),
    "counts-sum": (
        dict(y_counts=np.array([1, 1, 1, 1, 2], U16)),
        "y_counts adds up to 6 label ids but there are 5",
    ),
    "feature-out-of-range": (
        dict(x_deltas=np.array([0, 1, 2, 3, 4, 296], U16)),
        "feature id 300 out of range [0, 300)",
    ),
    "escape-missing": (
        dict(x_deltas=np.array([0, 1, 2, 3, 4, 0xFFFF], U16)),
        "x_deltas[5] is an escape but x_id_escapes is used up",
    ),
    "escape-unused": (
        dict(x_id_escapes=np.array([7], I32)),
        "x_id_escapes has 1 entries that no code refers to",
    ),
    "value-escape-missing": (
        dict(x_scale=np.array([0, 0, 15, 0, 0, 0], np.uint8)),
        "x_scale[2] is an escape but x_raw_values is used up",
    ),
    "values-short": (
        dict(x_digits=np.ones(5, U16)),
        "x_digits has 5 entries and x_scale 6 for 6 feature ids",
    ),
    "label-negative": (
        dict(y_indices=np.array([-1, 0, 1, 2, 3], I32)),
        "label id -1 out of range [0, 50)",
    ),
    "nan": (
        dict(x_scale=np.array([0, 0, 15, 0, 0, 0], np.uint8), x_raw_values=np.float32([np.nan])),
        "x_raw_values holds non-finite values",
    ),
    "wrong-dtype": (
        dict(x_deltas=np.arange(6, dtype=np.int64)),
        "x_deltas is int64[6], expected a 1-D uint16 array",
    ),
    "missing-array": (
        dict(y_indices=None),
        "chunk holds arrays ['x_counts', 'x_deltas', "
        "'x_digits', 'x_id_escapes', 'x_raw_values', 'x_scale', 'y_counts'], "
        "expected ['x_counts', 'x_deltas', 'x_digits', 'x_id_escapes', "
        "'x_raw_values', 'x_scale', 'y_counts', 'y_indices']",
    ),
}


@pytest.mark.parametrize("name", [*BAD_CHUNKS, "truncated", "not-zip"])
def test_bad_chunk(name: str) -> None:
    X = CSR(np.array([0, 1, 2, 3, 4, 6]), np.arange(6), np.ones(6), 300)
    good = XCDataset(X, CSR(np.arange(6), np.arange(5), None, 50))
    s = convert_from(good)
    if name in BAD_CHUNKS:
        replace, problem = BAD_CHUNKS[name]
        blob = _chunk_bytes(good, **replace)
    elif name == "truncated":
        blob, problem = _chunk_bytes(good)[:-100], None
    else:
        blob, problem = b"not a zip" * 100, None
    put(CHUNK, blob)
    m = json.loads(fsspec.open(s.url, "rb").open().read())
    if name != "truncated":
        m["chunks"][0]["bytes"] = len(blob)
    put(s.url, json.dumps(m).encode())
    (part,) = open_source("memory://badbin").partitions
    with pytest.raises(XCFormatError) as info:
        read_partition(part)
    msg = str(info.value)
    assert msg.startswith(CHUNK + ": ")
    if name == "truncated":
        assert f"chunk has {len(blob)} bytes but the manifest says {len(blob) + 100}" in msg
    elif name == "not-zip":
        assert "not a valid npz chunk (File is not a zip file)" in msg
    else:
        assert msg == f"{CHUNK}: {problem}"


def convert_from(d: XCDataset):
    write_xc("memory://badbin-src/train.txt", d)
    return convert("memory://badbin-src/train.txt", "memory://badbin")


@pytest.mark.parametrize(
    "edit, problem",
    [
        (
            lambda m: "{",
            "not valid JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1))",
        ),
        (
            lambda m: {**m, "version": 1},
            "format version 1, this reader knows 2 (convert the text again with `dslide convert`)",
        ),
        (lambda m: {**m, "format": "x"}, "not a dslide-xc-chunks manifest"),
        (lambda m: {**m, "n_points": 7}, "chunks hold 5 points but n_points is 7"),
        (lambda m: {**m, "n_labels": 0}, "n_labels must be an integer >= 1, got 0"),
        (
            lambda m: {**m, "chunks": [{**m["chunks"][0], "file": "../x.npz"}]},
            "chunks[0].file must be a file name in the folder, got '../x.npz'",
        ),
    ],
)
def test_bad_manifest(edit, problem: str) -> None:
    d = numbered(5)
    s = convert_from(d)
    m = json.loads(fsspec.open(s.url, "rb").open().read())
    new = edit(m)
    put(s.url, new.encode() if isinstance(new, str) else json.dumps(new).encode())
    with pytest.raises(XCFormatError) as info:
        open_source("memory://badbin")
    assert str(info.value) == f"memory://badbin/manifest.json: {problem}"

"""Training data from object storage: planning, byte ranges, compression, validation,
shuffling, the converted layout; read by real Dask worker processes from a local S3
server (moto) and by an in-process cluster from ``memory://``."""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import io
import json
import logging
import lzma
import os

import fsspec
import numpy as np
import pytest

from dslide_dask.data import CSR, XCDataset, XCFormatError, read_xc, write_xc
from dslide_dask.data.binary import _encode
from dslide_dask.data.convert import convert
from dslide_dask.data.partitions import DataSource, Partition, check_point_counts, concat
from dslide_dask.data.shuffle import ReadStats, epoch_order, iter_batches
from dslide_dask.data.source import index_partitions, open_source, read_dataset, read_partition
from tests.conftest import BUCKET


# -- helpers -----------------------------------------------------------------------------------
def numbered(n: int, seed: int = 0, n_features: int = 300, n_labels: int = 50) -> XCDataset:
    """Random rows whose feature 0 holds the row number + 1 (a row's identity)."""
    rng = np.random.default_rng(seed)
    nnz = rng.integers(0, 12, n)
    nl = rng.integers(0, 4, n)
    rows_x = [np.sort(rng.choice(np.arange(1, n_features), k, replace=False)) for k in nnz]
    x_idx = [np.concatenate([[0], r]) for r in rows_x]
    x_val = [
        np.concatenate([[i + 1.0], np.round(rng.random(len(r)), 3) + 0.001])
        for i, r in enumerate(rows_x)
    ]
    X = CSR(
        np.concatenate([[0], np.cumsum([len(r) for r in x_idx])]),
        np.concatenate(x_idx),
        np.concatenate(x_val),
        n_features,
    )
    Y = CSR.from_lists([np.sort(rng.choice(n_labels, k, replace=False)) for k in nl], n_labels)
    return XCDataset(X, Y)


def row_ids(d: XCDataset) -> np.ndarray:
    return d.X.data[d.X.indptr[:-1]].astype(np.int64) - 1


def assert_same(a: XCDataset, b: XCDataset) -> None:
    assert a.X.shape == b.X.shape and a.Y.shape == b.Y.shape
    for m, n in ((a.X, b.X), (a.Y, b.Y)):
        np.testing.assert_array_equal(m.indptr, n.indptr)
        np.testing.assert_array_equal(m.indices, n.indices)
    np.testing.assert_array_equal(a.X.data, b.X.data)


def read_all(src: DataSource, skip: bool = False) -> tuple[XCDataset, int]:
    """Every partition in storage order, point counts checked."""
    outs = [read_partition(p, skip) for p in src.partitions]
    check_point_counts(src.partitions, [len(d) + k for d, k in outs])
    return concat([d for d, _ in outs], src.n_features, src.n_labels), sum(k for _, k in outs)


def indexed(src: DataSource) -> DataSource:
    return dataclasses.replace(src, partitions=tuple(index_partitions(src.partitions)))


def put(url: str, data: bytes, **so) -> str:
    with fsspec.open(url, "wb", **so) as f:
        f.write(data)
    return url


def text_of(d: XCDataset) -> bytes:
    write_xc("memory://scratch/t.txt", d)
    with fsspec.open("memory://scratch/t.txt", "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def data() -> XCDataset:
    return numbered(600, seed=1)


# -- local servers and clusters ----------------------------------------------------------------
@contextlib.contextmanager
def cluster(processes: bool):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2 if processes else 1,
            threads_per_worker=1 if processes else 2,
            processes=processes,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as c,
        Client(c) as client,
    ):
        client.wait_for_workers(len(c.workers))
        yield client


def pid_and_read(part):
    return os.getpid(), *read_partition(part)


# -- object storage with real workers ----------------------------------------------------------
@pytest.mark.slow
def test_s3_byte_ranges_read_by_worker_processes(s3, data: XCDataset) -> None:
    url = f"s3://{BUCKET}/one/train.txt"
    write_xc(url, data, storage_options=s3)
    gz = put(f"s3://{BUCKET}/one/train.txt.gz", gzip.compress(text_of(data)), **s3)
    put(f"s3://{BUCKET}/bad/train.txt", b"3 10 5\n1 1:1\n2 2:1\n3 12:1\n", **s3)
    src = open_source(url, storage_options=s3, partition_bytes=4000)
    assert len(src.partitions) > 4 and src.partitions[0].storage_options == s3
    with cluster(processes=True) as client:
        workers = sorted(client.scheduler_info()["workers"])
        futures = [
            client.submit(pid_and_read, p, workers=[workers[i % 2]], pure=False)
            for i, p in enumerate(src.partitions)
        ]
        pids, parts, skipped = zip(*client.gather(futures), strict=True)
        assert os.getpid() not in pids and len(set(pids)) == 2  # two real worker processes
        assert sum(skipped) == 0
        assert_same(concat(parts, src.n_features, src.n_labels), read_xc(url, s3))
        # an exact index, counted on the workers
        indexed = index_partitions(src.partitions, lambda f, xs: client.gather(client.map(f, xs)))
        lines = [p.first_line for p in indexed]
        assert lines[0] == 1 and lines == sorted(set(lines))
        assert indexed[0].file_lines == data.n_points + 1
        assert sum(len(d) for d, _ in map(read_partition, indexed)) == data.n_points
        # compressed: one partition
        (part,) = open_source(gz, storage_options=s3).partitions
        assert_same(client.submit(read_partition, part).result()[0], data)
        # errors travel back with the URL and the line
        bad = open_source(f"s3://{BUCKET}/bad/train.txt", storage_options=s3).partitions
        with pytest.raises(XCFormatError, match=rf"^s3://{BUCKET}/bad/train.txt:4: feature id 12"):
            client.submit(read_partition, bad[0]).result()


def test_s3_folder_convert_and_simplecache(s3, data: XCDataset, tmp_path) -> None:
    folder = f"s3://{BUCKET}/parts"
    for k, lo in enumerate(range(0, data.n_points, 250)):
        write_xc(f"{folder}/part-{k:02d}.txt", data.slice(lo, lo + 250), storage_options=s3)
    put(f"{folder}/_SUCCESS", b"", **s3)
    src = open_source(folder + "/", storage_options=s3)
    assert [p.url for p in src.partitions] == [f"{folder}/part-{k:02d}.txt" for k in range(3)]
    assert_same(read_all(src)[0], data)
    summary = convert(folder, f"s3://{BUCKET}/bin", chunk_points=256, storage_options=s3)
    assert summary.n_chunks == 3 and summary.n_points == data.n_points
    binary = open_source(f"s3://{BUCKET}/bin", storage_options=s3)
    assert binary.format == "npz" and binary.n_points == data.n_points
    assert_same(read_all(binary)[0], data)
    # chained URL: plain options go to s3, not to the cache
    cached = open_source(f"simplecache::{folder}/part-*.txt", storage_options=s3)
    assert cached.partitions[0].url == f"simplecache::{folder}/part-00.txt"
    batches = list(iter_batches(cached.partitions, 64, epoch=0, seed=1))
    assert sorted(np.concatenate([row_ids(b) for b in batches])) == list(range(data.n_points))


def test_memory_in_process_cluster(data: XCDataset) -> None:
    url = "memory://inproc/train.txt"
    write_xc(url, data)
    src = open_source(url, partition_bytes=3000)
    with cluster(processes=False) as client:  # memory:// is per process: threads only
        outs = client.gather(client.map(read_partition, list(src.partitions)))
    assert_same(concat([d for d, _ in outs], src.n_features, src.n_labels), data)


# -- planning and reading ----------------------------------------------------------------------
@pytest.mark.parametrize("partition_bytes", [1, 13, 200, 5000, 10**9])
def test_byte_ranges_equal_whole_file(data: XCDataset, partition_bytes: int) -> None:
    url = "memory://ranges/train.txt"
    data = data.slice(0, 100) if partition_bytes == 1 else data
    write_xc(url, data)
    src = open_source(url, partition_bytes=partition_bytes)
    assert_same(read_all(src)[0], data)
    assert_same(read_all(indexed(src))[0], data)


@pytest.mark.parametrize("partition_bytes", [1, 7, 30, 10**9])
def test_byte_ranges_odd_text(partition_bytes: int) -> None:
    # CRLF, an empty point, a long line, blank trailing lines, no final newline
    long = b"1 " + b" ".join(b"%d:0.5" % i for i in range(200))
    for tail in (b"\r\n\r\n  \n\n", b"", b"\n"):
        text = b"5 300 5\r\n0,2 1:0.5\r\n\r\n" + long + b"\r\n3 7:1e-3\r\n 9:2" + tail
        url = put("memory://odd/train.txt", text)
        got = read_all(open_source(url, partition_bytes=partition_bytes))[0]
        assert_same(got, read_xc(url))
        assert got.n_points == 5


def test_glob_and_folder(tmp_path, data: XCDataset) -> None:
    for k, lo in enumerate(range(0, 600, 200)):
        write_xc(str(tmp_path / f"part-{k}.txt"), data.slice(lo, lo + 200))
    (tmp_path / ".part-0.txt.crc").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    for url in (str(tmp_path), str(tmp_path / "part-*.txt"), f"file://{tmp_path}/"):
        src = open_source(url)
        assert src.n_points == 600 and len(src.partitions) == 3, url
        assert_same(read_all(src)[0], data)
    assert open_source(str(tmp_path / "part-*.txt")).partitions[1].url == str(
        tmp_path / "part-1.txt"
    )
    assert_same(read_dataset(str(tmp_path / "part-*.txt"), n_threads=2)[0], data)
    with pytest.raises(FileNotFoundError, match="no files match"):
        open_source(str(tmp_path / "nothing-*.txt"))
    with pytest.raises(FileNotFoundError, match="no data files in the folder"):
        open_source(str(tmp_path / "sub"))


@pytest.mark.parametrize(
    "ext, pack",
    [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress), (".zst", None)],
)
def test_compression_round_trip(data: XCDataset, ext: str, pack) -> None:
    if pack is None:
        zstd = pytest.importorskip("zstandard")
        pack = zstd.ZstdCompressor().compress
    url = put(f"memory://comp/train.txt{ext}", pack(text_of(data)))
    src = open_source(url, partition_bytes=100)
    assert len(src.partitions) == 1 and src.partitions[0].compression is not None
    assert_same(read_all(src)[0], data)


def test_zstd_missing_names_the_package(monkeypatch) -> None:
    monkeypatch.delitem(fsspec.compression.compr, "zstd", raising=False)
    put("memory://nozstd/train.txt.zst", b"\x28\xb5\x2f\xfd")
    with pytest.raises(
        ImportError, match=r"train.txt.zst is zstd-compressed.*pip install zstandard"
    ):
        open_source("memory://nozstd/train.txt.zst")


def test_file_replaced_after_planning() -> None:
    url = put("memory://replaced/train.txt", b"1 10 5\n1 1:1\n")
    src = open_source(url)
    put(url, b"2 10 5\n1 1:1\n2 2:1\n")
    with pytest.raises(XCFormatError, match="header is now 2 10 5 but was 1 10 5 when the data"):
        read_partition(src.partitions[0])


# -- skip-bad-lines ----------------------------------------------------------------------------
def test_skip_bad_lines(data: XCDataset, caplog) -> None:
    lines = text_of(data).split(b"\n")
    lines[50] = b"1 2:x"  # point 49
    lines[300] = b"-3 4:1"  # point 299
    lines[555] = b"1 7:1 7:2"  # point 554
    url = put("memory://skip/train.txt", b"\n".join(lines))
    keep = np.setdiff1d(np.arange(600), [49, 299, 554])
    for pb in (10**9, 2000):
        src = open_source(url, partition_bytes=pb)
        with pytest.raises(XCFormatError, match=r":51: bad value 'x'"):
            read_all(src)
        with caplog.at_level(logging.WARNING, "dslide_dask.data.source"):
            got, skipped = read_all(src, skip=True)
        assert skipped == 3 and "bad value 'x'" in caplog.text
        assert_same(got, data.take(keep))
        stats = ReadStats()
        n = sum(
            len(b) for b in iter_batches(src.partitions, 50, 0, 0, skip_bad_lines=True, stats=stats)
        )
        assert n == stats.n_points == 597 and stats.n_skipped == 3
        assert "3 bad line(s) skipped" in stats.summary()
    # a header count that disagrees is still an error
    put("memory://skip/short.txt", b"3 10 5\n1 1:1\n1 x\n")
    with pytest.raises(XCFormatError, match=":4: the file ends after 2 point"):
        read_all(open_source("memory://skip/short.txt"), skip=True)


# -- shuffling ---------------------------------------------------------------------------------
def test_shuffle_deterministic_permutation_bounded() -> None:
    d = numbered(5000, seed=2)
    url = "memory://shuffle/train.txt"
    write_xc(url, d)
    parts = open_source(url, partition_bytes=8000).partitions
    assert len(parts) > 10
    assert [p.start for p in epoch_order(parts, 3, 7)] == [
        p.start for p in epoch_order(parts, 3, 7)
    ]
    assert [p.start for p in epoch_order(parts, 3, 7)] != [
        p.start for p in epoch_order(parts, 4, 7)
    ]

    def epoch(e: int, seed: int, buffer: int = 1000) -> tuple[list[np.ndarray], ReadStats]:
        stats = ReadStats()
        ids = [row_ids(b) for b in iter_batches(parts, 64, e, seed, buffer, stats=stats)]
        return ids, stats

    a, stats = epoch(0, 1)
    b, _ = epoch(0, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert [len(x) for x in a] == [64] * (5000 // 64) + [5000 % 64]
    flat = np.concatenate(a)
    assert np.array_equal(np.sort(flat), np.arange(5000))  # each point exactly once
    assert not np.array_equal(flat, np.concatenate(epoch(1, 1)[0]))
    assert not np.array_equal(flat, np.concatenate(epoch(0, 2)[0]))
    assert stats.n_points == 5000 and stats.n_partitions == len(parts)
    assert 1000 <= stats.max_buffered <= 1000 + 63  # bounded buffer
    first = a[0] // 400  # rows come from several byte ranges (~400 points each)
    assert len(np.unique(first)) >= 3
    _, small = epoch(0, 1, buffer=0)
    assert small.max_buffered < 64


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


# -- the malformed-file corpus -----------------------------------------------------------------
H = b"3 10 5\n"
OK3 = H + b"1 1:1\n2 2:1\n3 3:1\n"
EMPTY = "empty file (expected header 'N_points N_features N_labels')"
HEADER = "header must be 3 non-negative integers 'N_points N_features N_labels', got "
TRUNC = " (the file ends mid-line: truncated?)"
SPLIT = 12  # partition bytes that split the files below into several ranges
# name: ({file: bytes}, file read, partition bytes, index first, line, problem)
# line None: "URL: problem"; the URL is memory://corpus/<name>/<file>
CORPUS = {
    "empty": ({"t.txt": b""}, "t.txt", SPLIT, False, 1, EMPTY),
    "blank": ({"t.txt": b" \n\n"}, "t.txt", SPLIT, False, 1, EMPTY),
    "no-header": ({"t.txt": b"1,2 3:0.5\n"}, "t.txt", SPLIT, False, 1, HEADER + "'1,2 3:0.5'"),
    "header-4-numbers": ({"t.txt": b"3 10 5 1\n"}, "t.txt", SPLIT, False, 1,
                         HEADER + "'3 10 5 1'"),
    "fewer-points": ({"t.txt": H + b"1 1:1\n2 2:1\n"}, "t.txt", 10**6, False, 4,
                     "the file ends after 2 point(s) but the header says N_points = 3"),
    "more-points": ({"t.txt": OK3 + b"4 4:1\n"}, "t.txt", 10**6, False, 5,
                    "more points than the header's N_points = 3 (found '4')"),
    "fewer-points-split": ({"t.txt": H + b"1 1:1\n2 2:1\n"}, "t.txt", SPLIT, False, 4,
                           "the file ends after 2 point(s) but the header says N_points = 3"),
    "more-points-split": ({"t.txt": OK3 + b"4 4:1\n"}, "t.txt", SPLIT, False, 5,
                          "more points than the header's N_points = 3 (the file has 4)"),
    "fewer-points-indexed": ({"t.txt": H + b"1 1:1\n2 2:1\n"}, "t.txt", SPLIT, True, 4,
                             "the file ends after 2 point(s) but the header says N_points = 3"),
    "more-points-indexed": ({"t.txt": OK3 + b"\n4 4:1\n"}, "t.txt", SPLIT, True, 6,
                            "more points than the header's N_points = 3 (found '4')"),
    "label-range": ({"t.txt": H + b"1 1:1\n2 2:1\n5 3:1\n"}, "t.txt", SPLIT, False, 4,
                    "label id 5 >= n_labels 5"),
    "feature-range": ({"t.txt": H + b"1 1:1\n2 2:1\n3 10:1\n"}, "t.txt", SPLIT, False, 4,
                      "feature id 10 >= n_features 10"),
    "label-negative": ({"t.txt": H + b"1 1:1\n\n-2 3:1\n"}, "t.txt", SPLIT, False, 4,
                       "negative label id -2"),
    "feature-negative": ({"t.txt": H + b"1 1:1\n2 -2:1\n3 3:1\n"}, "t.txt", SPLIT, False, 3,
                         "negative feature id -2"),
    "feature-not-integer": ({"t.txt": H + b"1 1:1\n2 2:1\n3 2.5:1\n"}, "t.txt", SPLIT, False,
                            4, "feature id '2.5' is not a non-negative integer"),
    "bad-value": ({"t.txt": H + b"1 1:1\n2 2:1\n3 3:1,5\n"}, "t.txt", SPLIT, False, 4,
                  "bad value '1,5' in feature '3:1,5'"),
    "nan": ({"t.txt": H + b"1 1:1\n2 2:1\n3 3:NaN\n"}, "t.txt", SPLIT, False, 4,
            "non-finite value 'NaN' in feature '3:NaN'"),
    "inf": ({"t.txt": H + b"1 1:1\n2 2:inf\n3 3:1\n"}, "t.txt", SPLIT, False, 3,
            "non-finite value 'inf' in feature '2:inf'"),
    "float32-overflow": ({"t.txt": H + b"1 1:1\n2 2:1\n3 3:4e38\n"}, "t.txt", SPLIT, False, 4,
                         "value in feature '3:4e38' overflows float32"),
    "duplicate-feature": ({"t.txt": H + b"1 1:1\n2 2:1\n3 3:1 1:1 3:2\n"}, "t.txt", SPLIT,
                          False, 4, "duplicate feature id 3"),
    "duplicate-label": ({"t.txt": H + b"1 1:1\n2 2:1\n3,1,3 3:1\n"}, "t.txt", SPLIT, False, 4,
                        "duplicate label id 3"),
    "labels-without-blank": ({"t.txt": H + b"1 1:1\n2 2:1\n3:1\n"}, "t.txt", SPLIT, False, 4,
                             "expected comma-separated label ids, got '3:1' (a point without "
                             "labels must start with a blank)"),
    "truncated-last-line": ({"t.txt": H + b"1 1:1\n2 2:1\n3 4:"}, "t.txt", SPLIT, False, 4,
                            "empty value in feature '4:'" + TRUNC),
    "not-gzip": ({"t.txt.gz": OK3}, "t.txt.gz", SPLIT, False, None,
                 "not a valid gzip file (Not a gzipped file (b'3 '))"),
    "truncated-gzip": ({"t.txt.gz": gzip.compress(OK3 * 40)[:-12]}, "t.txt.gz", SPLIT, False,
                       None, "truncated gzip stream (Compressed file ended before the "
                       "end-of-stream marker was reached)"),
    "not-bz2": ({"t.txt.bz2": OK3}, "t.txt.bz2", SPLIT, False, None,
                "not a valid bz2 file (Invalid data stream)"),
    "not-xz": ({"t.txt.xz": gzip.compress(OK3)}, "t.txt.xz", SPLIT, False, None,
               "not a valid xz file (Input format not supported by decoder)"),
    "gzip-named-txt": ({"t.txt": gzip.compress(OK3)}, "t.txt", SPLIT, False, None,
                       "this is gzip-compressed data, but the name does not say so "
                       "(name it *.gz to have it decompressed)"),
    "bad-line-in-gzip": ({"t.txt.gz": gzip.compress(H + b"1 1:1\n2 2:1\n3 3:x\n")}, "t.txt.gz",
                         SPLIT, False, 4, "bad value 'x' in feature '3:x'"),
    "parts-disagree": ({"p-0.txt": OK3, "p-1.txt": b"1 10 6\n1 1:1\n"}, "p-1.txt", SPLIT,
                       False, 1, "header says 10 features and 6 labels but "
                       "memory://corpus/parts-disagree/p-0.txt says 10 and 5: the files do "
                       "not belong together"),
    "bad-line-in-part": ({"p-0.txt": OK3, "p-1.txt": b"2 10 5\n1 1:1\n7 1:1\n"}, "p-1.txt",
                         SPLIT, False, 3, "label id 7 >= n_labels 5"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CORPUS))
def test_malformed_corpus(name: str) -> None:
    files, target, partition_bytes, index, line, problem = CORPUS[name]
    root = f"memory://corpus/{name}"
    for fname, blob in files.items():
        put(f"{root}/{fname}", blob)
    url = f"{root}/{target}"
    expected = f"{url}:{line}: {problem}" if line else f"{url}: {problem}"
    with pytest.raises(XCFormatError) as info:
        src = open_source(root if len(files) > 1 else url, partition_bytes=partition_bytes)
        if index:
            src = indexed(src)
        read_all(src)
    assert str(info.value) == expected
    assert (info.value.source, info.value.line, info.value.problem) == (url, line, problem)


# -- command line ------------------------------------------------------------------------------
def test_convert_command(s3, data: XCDataset, capsys) -> None:
    import argparse

    from dslide_workflows.args import storage_options
    from dslide_workflows.convert import add_convert_parser

    assert storage_options([("a.b", 1), ("a.c", "x"), ("d", True)]) == {
        "a": {"b": 1, "c": "x"},
        "d": True,
    }
    with pytest.raises(ValueError, match="nests under a non-mapping"):
        storage_options([("a", 1), ("a.b", 2)])
    lines = text_of(data).split(b"\n")
    lines[7] = b"1 2:x"
    put(f"s3://{BUCKET}/cli/train.txt", b"\n".join(lines), **s3)
    parser = argparse.ArgumentParser()
    add_convert_parser(parser.add_subparsers())
    endpoint = s3["client_kwargs"]["endpoint_url"]
    argv = ["convert", f"s3://{BUCKET}/cli/train.txt", f"s3://{BUCKET}/cli/bin"]
    argv += ["--chunk-points", "100", "--skip-bad-lines"]
    argv += ["--storage-option", "key=testing", "--storage-option", "secret=testing"]
    argv += ["--storage-option", f"client_kwargs.endpoint_url={endpoint}"]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"-> s3://{BUCKET}/cli/bin/manifest.json: 599 points in 6 chunks" in out
    assert "skipped 1 bad line(s)" in out
    src = open_source(f"s3://{BUCKET}/cli/bin", storage_options=s3)
    assert_same(read_all(src)[0], data.take(np.r_[0:6, 7:600]))


@pytest.mark.slow
def test_storage_benchmark_smoke(tmp_path, capsys) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from dslide_workflows.cli import main

    out = tmp_path / "result.json"
    argv = ["bench", "storage", "--preset", "tiny", "--workers", "1", "--repeat", "1"]
    argv += ["--partition-mb", "1", "--cache-dir", str(tmp_path), "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["n_points"] == 5000 and result["speedup"] > 0
    assert "shuffled epoch, 1 process, converted" in capsys.readouterr().out

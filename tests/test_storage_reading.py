"""Training data from storage, read in a process: planning byte ranges (files, globs,
folders) that read as the whole file does however they split it, odd text (CRLF, blank
and long lines), compression, a file replaced after planning, bad lines skipped and
counted, shuffled epochs (deterministic, each point once, a bounded buffer), and the
malformed-file corpus: each error names the URL, the line and the problem.
"""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma

import fsspec
import numpy as np
import pytest

from dslide_dask.data import XCDataset, XCFormatError, read_xc, write_xc
from dslide_dask.data.shuffle import ReadStats, epoch_order, iter_batches
from dslide_dask.data.source import open_source, read_dataset, read_partition
from tests.storage import assert_same, indexed, numbered, put, read_all, row_ids, text_of


@pytest.fixture(scope="module")
def data() -> XCDataset:
    """600 numbered rows (tests.storage.numbered), seed 1."""
    return numbered(600, seed=1)


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


def test_links_in_a_glob_or_folder_are_read(tmp_path, data: XCDataset) -> None:
    write_xc(str(tmp_path / "rows.txt"), data.slice(200, 600))
    (tmp_path / "in").mkdir()
    write_xc(str(tmp_path / "in" / "part-0.txt"), data.slice(0, 200))
    (tmp_path / "in" / "part-1.txt").symlink_to(tmp_path / "rows.txt")
    for url in (str(tmp_path / "in"), str(tmp_path / "in" / "part-*.txt")):
        assert_same(read_all(open_source(url))[0], data)
    (tmp_path / "in" / "part-2.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(FileNotFoundError, match="part-2.txt: a link to a missing file"):
        open_source(str(tmp_path / "in" / "part-*.txt"))


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
                         "value in feature '3:4e38' overflows float32 arithmetic "
                         "(values must be in [-1e+15, 1e+15]: scale the data)"),
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

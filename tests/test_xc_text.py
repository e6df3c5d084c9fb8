"""The Extreme Classification text format: parsing, formatting, validation messages."""

from __future__ import annotations

import pickle

import fsspec
import numpy as np
import pytest

from dslide_dask.data import (
    CSR,
    XCDataset,
    XCFormatError,
    make_synthetic,
    parse_xc,
    read_xc,
    write_xc,
)
from dslide_dask.kernels import xc_text as K


@pytest.fixture(scope="module")
def tiny() -> XCDataset:
    return make_synthetic("tiny", seed=3)[1]


def assert_same(a: XCDataset, b: XCDataset) -> None:
    assert a.X.shape == b.X.shape and a.Y.shape == b.Y.shape
    for m, n in ((a.X, b.X), (a.Y, b.Y)):
        np.testing.assert_array_equal(m.indptr, n.indptr)
        np.testing.assert_array_equal(m.indices, n.indices)
    np.testing.assert_array_equal(a.X.data, b.X.data)
    assert a.Y.data is None and b.Y.data is None


def test_parse_basic_forms() -> None:
    text = (
        b"4 10 5\r\n"
        b"1,3 2:0.5 7:1e-3\r\n"  # CRLF
        b" 4:-2.5  \n"  # no labels, trailing blanks
        b"0\n"  # labels only
        b"2\t1:+.5E+1 9:7."  # tab separator, last line without newline
    )
    d = parse_xc(text)
    assert (d.n_points, d.n_features, d.n_labels) == (4, 10, 5)
    assert [r.tolist() for r in d.Y.to_lists()] == [[1, 3], [], [0], [2]]
    assert d.X.indptr.tolist() == [0, 2, 3, 3, 5]
    assert d.X.indices.tolist() == [2, 7, 4, 1, 9]
    np.testing.assert_array_equal(d.X.data, np.float32([0.5, 1e-3, -2.5, 5.0, 7.0]))


@pytest.mark.parametrize(
    "text",
    [b"0 3 3\n", b"0 3 3", b"2 3 3\n1\n\n", b"1 3 3\n1 1:1\n\n  \n"],
    ids=["empty-body", "no-newline", "empty-point", "trailing-blank-lines"],
)
def test_parse_edge_cases_ok(text: bytes) -> None:
    d = parse_xc(text)
    assert d.n_features == 3 and d.n_labels == 3


@pytest.mark.parametrize("url", ["file", "memory://xc-rt/train.txt", "memory://xc-rt/t.txt.gz"])
def test_round_trip_tiny(tiny: XCDataset, tmp_path, url: str) -> None:
    if url == "file":
        url = str(tmp_path / "new-dir" / "train.txt")  # the folder is created
    write_xc(url, tiny)
    back = read_xc(url)
    assert_same(back, tiny)  # synthetic values are already 6-digit: exact round trip


def test_write_edge_rows() -> None:
    # rows: labels + features, no labels, labels only, nothing at all (last)
    X = CSR(np.array([0, 2, 3, 3, 3]), np.array([1, 4, 0]), np.float32([0.5, 2, -1e-7]), 5)
    Y = CSR(np.array([0, 2, 2, 3, 3]), np.array([0, 2, 1]), None, 3)
    write_xc("memory://xc-edge/a.txt", XCDataset(X, Y))
    with fsspec.open("memory://xc-edge/a.txt", "rb") as f:
        assert f.read() == b"4 5 3\n0,2 1:0.5 4:2\n 0:-1e-7\n1\n\n"
    assert_same(read_xc("memory://xc-edge/a.txt"), XCDataset(X, Y))


def test_write_then_read_is_idempotent_for_arbitrary_values() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    with np.errstate(over="ignore"):
        vals = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 15, n)).astype(np.float32)
    vals[~(np.abs(vals) <= 1e15)] = 1.0  # the reader's bound (float32 arithmetic on it)
    vals[:3] = [0.0, 1e-45, 1e15]
    X = CSR(np.arange(n + 1), rng.integers(0, 50, n), vals, 50)
    Y = CSR(np.arange(n + 1), rng.integers(0, 9, n), None, 9)
    write_xc("memory://xc-idem/a.txt", XCDataset(X, Y))
    back = read_xc("memory://xc-idem/a.txt")
    np.testing.assert_allclose(back.X.data, vals, rtol=5e-6)
    write_xc("memory://xc-idem/b.txt", back)
    with (
        fsspec.open("memory://xc-idem/a.txt", "rb") as fa,
        fsspec.open("memory://xc-idem/b.txt", "rb") as fb,
    ):
        assert fa.read() == fb.read()


def test_float_format_matches_percent_g() -> None:
    rng = np.random.default_rng(1)
    vals = np.concatenate(
        [rng.random(500), rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)]
    ).astype(np.float32)
    out = np.zeros(16, np.uint8)
    for v in [*vals.tolist(), 0.5, 100000.0, 1e6, 1e-5, 1e-4, 661106.5]:
        v32 = float(np.float32(v))
        text = out[: K.write_float(out, 0, v32)].tobytes().decode()
        assert float(text) == float(f"{v32:.6g}"), (v32, text)
        assert float(np.float32(float(text))) == float(K.quantize6(v32))


def test_write_rejects_nonfinite() -> None:
    X = CSR(np.array([0, 1]), np.array([0]), np.float32([np.nan]), 2)
    Y = CSR(np.array([0, 0]), np.zeros(0), None, 2)
    with pytest.raises(ValueError, match="finite"):
        write_xc("memory://xc-nan/a.txt", XCDataset(X, Y))


def test_read_error_names_url() -> None:
    with fsspec.open("memory://xc-bad/train.txt", "wb") as f:
        f.write(b"2 10 5\n1 1:1\n2 12:1\n")
    with pytest.raises(XCFormatError, match=r"^memory://xc-bad/train.txt:3: feature id 12 >= "):
        read_xc("memory://xc-bad/train.txt")


H = b"2 10 5\n"
HEADER = "header must be 3 non-negative integers 'N_points N_features N_labels', got "
EMPTY = "empty file (expected header 'N_points N_features N_labels')"
TRUNC = " (the file ends mid-line: truncated?)"
# name: (file bytes, line, problem)
MALFORMED = {
    "empty": (b"", 1, EMPTY),
    "blank": (b"  \n\n", 1, EMPTY),
    "header-2-numbers": (b"2 10\n1 1:1\n", 1, HEADER + "'2 10'"),
    "header-word": (b"two 10 5\n", 1, HEADER + "'two 10 5'"),
    "header-negative": (b"2 -10 5\n", 1, HEADER + "'2 -10 5'"),
    "header-float": (b"2 10.5 5\n", 1, HEADER + "'2 10.5 5'"),
    "header-points-huge": (
        b"99999999999 10 5\n",
        1,
        "header N_points 99999999999 exceeds the file size (17 bytes)",
    ),
    "fewer-points": (
        H + b"1 1:1\n",
        3,
        "the file ends after 1 point(s) but the header says N_points = 2",
    ),
    "more-points": (
        H + b"1 1:1\n2 2:1\n3 3:1\n",
        4,
        "more points than the header's N_points = 2 (found '3')",
    ),
    "label-range": (H + b"1 1:1\n5 2:1\n", 3, "label id 5 >= n_labels 5"),
    "feature-range": (H + b"1 1:1\n2 10:1\n", 3, "feature id 10 >= n_features 10"),
    "feature-id-huge": (H + b"1 99999999999:1\n", 2, "feature id 99999999999 >= n_features 10"),
    "label-id-huge": (
        H + b"123456789012345678901234 1:1\n",
        2,
        "label id 123456789012345678901234 >= n_labels 5",
    ),
    "label-negative": (H + b"-1 1:1\n2 2:1\n", 2, "negative label id -1"),
    "label-float": (H + b"1.5 1:1\n", 2, "label id '1.5' is not a non-negative integer"),
    "label-empty": (H + b"1,,2 1:1\n", 2, "empty label id in '1,,2'"),
    "label-trailing-comma": (H + b"1, 1:1\n", 2, "empty label id in '1,'"),
    "labels-missing-no-blank": (
        H + b"3:0.5\n",
        2,
        "expected comma-separated label ids, got '3:0.5' "
        "(a point without labels must start with a blank)",
    ),
    "feature-negative": (H + b"1 -3:1\n", 2, "negative feature id -3"),
    "feature-no-id": (H + b"1 :0.5\n", 2, "missing feature id in ':0.5'"),
    "feature-id-alpha": (H + b"1 a:0.5\n", 2, "feature id 'a' is not a non-negative integer"),
    "feature-id-float": (H + b"1 2.5:0.5\n", 2, "feature id '2.5' is not a non-negative integer"),
    "no-colon": (H + b"1 3\n", 2, "malformed feature '3' (expected id:value)"),
    "wrong-separator": (H + b"1 3=0.5\n", 2, "malformed feature '3=0.5' (expected id:value)"),
    "empty-value": (H + b"1 3: 4:1\n", 2, "empty value in feature '3:'"),
    "bad-value": (H + b"1 3:abc\n", 2, "bad value 'abc' in feature '3:abc'"),
    "two-dots": (H + b"1 3:1.2.3\n", 2, "bad value '1.2.3' in feature '3:1.2.3'"),
    "bad-exponent": (H + b"1 3:1e\n", 2, "bad value '1e' in feature '3:1e'"),
    "nan": (H + b"1 3:nan\n", 2, "non-finite value 'nan' in feature '3:nan'"),
    "inf": (H + b"1 1:1\n1 3:-Inf\n", 3, "non-finite value '-Inf' in feature '3:-Inf'"),
    "float32-overflow": (
        H + b"1 3:1e39\n",
        2,
        "value in feature '3:1e39' overflows float32 arithmetic (values must be "
        "in [-1e+15, 1e+15]: scale the data)",
    ),
    "duplicate-feature": (H + b"1 3:1 4:1 3:2\n", 2, "duplicate feature id 3"),
    "duplicate-label": (H + b"1 1:1\n1,2,1 3:1\n", 3, "duplicate label id 1"),
    "truncated-value": (H + b"1 3:1\n2 4:", 3, "empty value in feature '4:'" + TRUNC),
    "truncated-id": (
        H + b"1 3:1\n2 4:0.5 7",
        3,
        "malformed feature '7' (expected id:value)" + TRUNC,
    ),
    "truncated-label": (H + b"1 3:1\n2,", 3, "empty label id in '2,'" + TRUNC),
}


def test_error_pickles() -> None:  # errors travel from Dask workers to the client
    err = pickle.loads(pickle.dumps(XCFormatError("s3://b/x.txt", 7, "duplicate label id 1")))
    assert str(err) == "s3://b/x.txt:7: duplicate label id 1" and err.line == 7


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed(name: str) -> None:
    text, line, problem = MALFORMED[name]
    with pytest.raises(XCFormatError) as info:
        parse_xc(text, source="s3://b/train.txt")
    assert str(info.value) == f"s3://b/train.txt:{line}: {problem}"
    assert (info.value.line, info.value.problem) == (line, problem)

"""The synthetic generator: presets, validation, determinism, statistics, learnability."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest

from dslide_dask.data import (
    PRESETS,
    SyntheticSpec,
    XCDataset,
    generate,
    make_synthetic,
    read_xc,
    resolve_spec,
)
from dslide_dask.metrics import precision_at_k

MID = SyntheticSpec(
    n_features=20_000,
    n_labels=10_000,
    n_train=20_000,
    n_test=2_000,
    avg_labels=4.0,
    avg_nnz=50.0,
    label_offset=10.0,
)


@pytest.fixture(scope="module")
def tiny() -> tuple[XCDataset, XCDataset]:
    return make_synthetic("tiny", seed=0)


@pytest.fixture(scope="module")
def mid() -> tuple[XCDataset, XCDataset]:
    return make_synthetic(MID, seed=1)


def same(a: XCDataset, b: XCDataset) -> bool:
    return all(
        np.array_equal(getattr(m, f), getattr(n, f))
        for m, n in ((a.X, b.X), (a.Y, b.Y))
        for f in ("indptr", "indices")
    ) and np.array_equal(a.X.data, b.X.data)


def test_presets() -> None:
    assert {"tiny", "small", "amazon-670k", "wiki-325k", "delicious-200k"} <= set(PRESETS)
    a = PRESETS["amazon-670k"]
    assert (a.n_features, a.n_labels, a.n_train, a.n_test) == (135_909, 670_091, 490_449, 153_025)
    assert (a.avg_labels, a.avg_nnz) == (5.45, 75.0)
    w = PRESETS["wiki-325k"]
    assert (w.n_features, w.n_labels, w.n_train, w.n_test) == (
        1_617_899,
        325_056,
        1_778_351,
        587_084,
    )
    m = PRESETS["amazon-3m"]
    assert (m.n_features, m.n_labels, m.n_train, m.n_test) == (
        337_067,
        2_812_281,
        1_717_899,
        742_507,
    )
    d = PRESETS["delicious-200k"]
    assert (d.n_features, d.n_labels, d.n_train, d.n_test) == (782_585, 205_443, 196_606, 100_095)
    assert d.avg_labels == 75.54


def test_resolve_spec() -> None:
    s = resolve_spec("tiny", n_train=100, signal_frac=0.5)
    assert (s.n_train, s.signal_frac, s.n_labels) == (100, 0.5, PRESETS["tiny"].n_labels)
    assert resolve_spec(s) is s
    with pytest.raises(ValueError, match="unknown synthetic preset 'nope'"):
        resolve_spec("nope")
    with pytest.raises(ValueError, match=r"unknown SyntheticSpec field\(s\) \['n_pts'\]"):
        resolve_spec("tiny", n_pts=3)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_features", 0, r"n_features must be in \[1, 2147483647\], got 0"),
        ("n_labels", -5, r"n_labels must be in \[1, "),
        ("n_train", 0, r"n_train must be in \[1, "),
        ("n_test", -1, r"n_test must be in \[0, "),
        ("n_train", 10.5, r"n_train must be an integer, got 10.5"),
        ("avg_labels", 0.5, r"avg_labels must be in \[1, 500 \(n_labels/2\)\], got 0.5"),
        ("avg_labels", 600, r"avg_labels must be in \[1, 500 \(n_labels/2\)\], got 600"),
        ("avg_nnz", 1000, r"avg_nnz must be in \[1, 500 \(n_features/4\)\], got 1000"),
        ("avg_nnz", float("nan"), r"avg_nnz must be in \[1, "),
        ("label_zipf", -1.0, r"label_zipf must be in \[0, 3\], got -1.0"),
        ("label_offset", -1.0, r"label_offset must be in \[0, "),
        ("n_topics", 1001, r"n_topics must be in \[0, 1000 \(n_labels\)\], got 1001"),
        ("topic_mix", 1.5, r"topic_mix must be in \[0, 1\], got 1.5"),
        ("signal_frac", -0.1, r"signal_frac must be in \[0, 1\], got -0.1"),
        ("sig_min", 0, r"sig_min must be in \[1, "),
        ("sig_max", 4, r"sig_max must be in \[8, 1000\], got 4"),
        ("nnz_sigma", 3.0, r"nnz_sigma must be in \[0, 2\], got 3.0"),
        ("empty_frac", 0.9, r"empty_frac must be in \[0, 0.5\], got 0.9"),
        ("feature_zipf", "x", r"feature_zipf must be a number, got 'x'"),
    ],
)
def test_bad_spec(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=r"SyntheticSpec\." + message):
        resolve_spec("tiny", **{field: value})


def test_deterministic_by_seed(tiny: tuple[XCDataset, XCDataset]) -> None:
    again = make_synthetic("tiny", seed=0, n_threads=1)  # thread count does not matter
    assert same(tiny[0], again[0]) and same(tiny[1], again[1])
    other = make_synthetic("tiny", seed=1)
    assert not same(tiny[0], other[0])


def test_fewer_points_give_a_prefix_of_the_same_rows(tiny) -> None:
    """What a slice of a huge preset relies on: a partial last chunk included."""
    train, test = make_synthetic(resolve_spec("tiny", n_train=3000, n_test=100), seed=0)
    assert same(train, tiny[0].slice(0, 3000)) and same(test, tiny[1].slice(0, 100))


def test_generate_files(tiny: tuple[XCDataset, XCDataset], tmp_path) -> None:
    urls = generate("tiny", str(tmp_path / "a"), seed=0)
    assert urls == {"train": str(tmp_path / "a/train.txt"), "test": str(tmp_path / "a/test.txt")}
    urls2 = generate("tiny", "memory://synth-b/", seed=0, n_threads=1)
    assert urls2["train"] == "memory://synth-b/train.txt"
    for name, data in zip(("train", "test"), tiny, strict=True):
        with fsspec.open(urls[name], "rb") as f, fsspec.open(urls2[name], "rb") as g:
            assert f.read() == g.read()  # byte-identical
        assert same(read_xc(urls[name]), data)  # the files hold what make_synthetic gives


def test_statistics(mid: tuple[XCDataset, XCDataset]) -> None:
    for d, n in zip(mid, (MID.n_train, MID.n_test), strict=True):
        assert (d.n_points, d.n_features, d.n_labels) == (n, MID.n_features, MID.n_labels)
        k, nnz = np.diff(d.Y.indptr), np.diff(d.X.indptr)
        assert abs(k.mean() / MID.avg_labels - 1) < 0.1
        assert abs(nnz.mean() / MID.avg_nnz - 1) < 0.1
        assert (k == 0).mean() < 0.01 and nnz.min() >= 1
        for m in (d.X, d.Y):
            assert m.indices.min() >= 0 and m.indices.max() < m.n_cols
            starts = np.zeros(m.nnz, bool)
            starts[m.indptr[:-1][np.diff(m.indptr) > 0]] = True
            assert np.all((np.diff(m.indices) > 0) | starts[1:])  # rows strictly ascending
        assert np.all(d.X.data > 0)
        norms = np.sqrt(np.add.reduceat(d.X.data.astype(np.float64) ** 2, d.X.indptr[:-1]))
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    freq = np.sort(np.bincount(mid[0].Y.indices, minlength=MID.n_labels))[::-1]
    assert freq[: MID.n_labels // 100].sum() > 0.2 * freq.sum()  # heavy head
    assert np.median(freq) <= 0.5 * freq.mean()  # long tail of rare labels


def test_learnable(tiny: tuple[XCDataset, XCDataset]) -> None:
    train, test = tiny

    def dense(m) -> np.ndarray:
        out = np.zeros(m.shape, np.float32)
        out[np.repeat(np.arange(m.n_rows), np.diff(m.indptr)), m.indices] = m.values()
        return out

    centroids = dense(train.Y).T @ dense(train.X)  # per-label feature sums
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) + 1e-12
    top = np.argsort(-(dense(test.X) @ centroids.T), axis=1)[:, :5]
    p1 = precision_at_k(top, test.Y)["P@1"]
    freq = np.bincount(train.Y.indices, minlength=train.n_labels)
    base = precision_at_k(np.tile(np.argsort(-freq)[:5], (test.n_points, 1)), test.Y)["P@1"]
    assert base < 0.1
    assert 0.5 < p1 < 0.9

"""Synthetic extreme-classification data with the statistics of the real sets and
learnable structure.

Model (all knobs in :class:`SyntheticSpec`):

- Label popularity is Zipf-Mandelbrot, weight(rank r) = (r + label_offset)^-label_zipf,
  with a random rank -> id mapping (ids carry no frequency information).
- Labels are split evenly at random into ``n_topics`` topics. A point picks a topic
  ∝ its mass and draws each label from it with prob ``topic_mix`` (else globally), ∝
  popularity, so co-occurring labels share a topic; the label marginal stays Zipf.
- Each label owns ``sig_min..sig_max`` signature features (fixed by seed and label id,
  drawn ∝ rank^-sig_zipf over a random feature order). A point's features come a
  fraction ``signal_frac`` from its labels' signatures (signal) and the rest from a
  background Zipf(feature_zipf) over features (noise); values are tf * idf * jitter,
  L2-normalized and rounded to 6 significant digits (exactly what a text round trip
  gives back).
- Labels a point: 0 with prob ``empty_frac``, else 1 + geometric; features a point:
  log-normal (``nnz_sigma``); means are ``avg_labels`` and ``avg_nnz``.

Points are generated in fixed chunks of ``CHUNK_POINTS`` with seeds derived from
``(seed, split, chunk)``, in parallel threads: the same seed gives the same bytes
whatever the thread count, and a spec with fewer points gives a prefix of the same rows
(so a slice of ``amazon-3m`` costs its own size, not the set's).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.partitions import ordered_map
from dslide_dask.data.seeds import derive_seed
from dslide_dask.kernels import synthetic as K
from dslide_dask.kernels.xc_text import format_rows

CHUNK_POINTS = 2048  # part of the determinism contract: changing it changes the data
_INT32_MAX = np.iinfo(np.int32).max
_TRAIN, _TEST = 1, 2


@dataclass(frozen=True)
class SyntheticSpec:
    """Size, statistics and structure of a synthetic data set (see the module doc)."""

    n_features: int
    n_labels: int
    n_train: int
    n_test: int
    avg_labels: float
    avg_nnz: float
    label_zipf: float = 1.0
    label_offset: float = 10.0
    feature_zipf: float = 1.0
    n_topics: int = 0  # 0: automatic, about n_labels / max(50, 4 * avg_labels)
    topic_mix: float = 0.8
    signal_frac: float = 0.25
    sig_min: int = 8
    sig_max: int = 20
    sig_zipf: float = 0.5
    nnz_sigma: float = 0.5
    empty_frac: float = 0.001

    def __post_init__(self) -> None:
        _check_int("n_features", self.n_features, 1, _INT32_MAX)
        _check_int("n_labels", self.n_labels, 1, _INT32_MAX)
        _check_int("n_train", self.n_train, 1, _INT32_MAX)
        _check_int("n_test", self.n_test, 0, _INT32_MAX)
        _check_num("avg_labels", self.avg_labels, 1.0, max(1.0, self.n_labels / 2), "n_labels/2")
        _check_num("avg_nnz", self.avg_nnz, 1.0, max(1.0, self.n_features / 4), "n_features/4")
        _check_num("label_zipf", self.label_zipf, 0.0, 3.0)
        _check_num("label_offset", self.label_offset, 0.0, 1e9)
        _check_num("feature_zipf", self.feature_zipf, 0.0, 3.0)
        _check_int("n_topics", self.n_topics, 0, self.n_labels, "n_labels")
        _check_num("topic_mix", self.topic_mix, 0.0, 1.0)
        _check_num("signal_frac", self.signal_frac, 0.0, 1.0)
        _check_int("sig_min", self.sig_min, 1, min(1000, self.n_features))
        _check_int("sig_max", self.sig_max, self.sig_min, min(1000, self.n_features))
        _check_num("sig_zipf", self.sig_zipf, 0.0, 3.0)
        _check_num("nnz_sigma", self.nnz_sigma, 0.0, 2.0)
        _check_num("empty_frac", self.empty_frac, 0.0, 0.5)

    @property
    def topics(self) -> int:
        """The number of topics actually used (``n_topics`` or the automatic choice)."""
        if self.n_topics:
            return self.n_topics
        return max(1, min(self.n_labels, round(self.n_labels / max(50.0, 4 * self.avg_labels))))


def _check_int(name: str, v: object, lo: int, hi: int, hi_name: str | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise ValueError(f"SyntheticSpec.{name} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        bound = f"{hi}" if not hi_name else f"{hi} ({hi_name})"
        raise ValueError(f"SyntheticSpec.{name} must be in [{lo}, {bound}], got {v}")


def _check_num(name: str, v: object, lo: float, hi: float, hi_name: str | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise ValueError(f"SyntheticSpec.{name} must be a number, got {v!r}")
    if not (math.isfinite(v) and lo <= v <= hi):
        bound = f"{hi:g}" if not hi_name else f"{hi:g} ({hi_name})"
        raise ValueError(f"SyntheticSpec.{name} must be in [{lo:g}, {bound}], got {v}")


PRESETS: dict[str, SyntheticSpec] = {
    "tiny": SyntheticSpec(
        n_features=2_000,
        n_labels=1_000,
        n_train=5_000,
        n_test=1_000,
        avg_labels=3.0,
        avg_nnz=40.0,
    ),
    # `dslide demo`: labels enough that a step computes 2.5% of them, a minute to train
    "demo": SyntheticSpec(
        n_features=50_000,
        n_labels=100_000,
        n_train=30_000,
        n_test=3_000,
        avg_labels=4.0,
        avg_nnz=60.0,
        label_offset=20.0,
    ),
    "small": SyntheticSpec(
        n_features=20_000,
        n_labels=20_000,
        n_train=50_000,
        n_test=10_000,
        avg_labels=4.0,
        avg_nnz=60.0,
        label_offset=20.0,
    ),
    "amazon-670k": SyntheticSpec(
        n_features=135_909,
        n_labels=670_091,
        n_train=490_449,
        n_test=153_025,
        avg_labels=5.45,
        avg_nnz=75.0,
        label_offset=50.0,
    ),
    "amazon-3m": SyntheticSpec(
        n_features=337_067,
        n_labels=2_812_281,
        n_train=1_717_899,
        n_test=742_507,
        avg_labels=36.04,
        avg_nnz=36.17,
        label_offset=50.0,
    ),
    "wiki-325k": SyntheticSpec(
        n_features=1_617_899,
        n_labels=325_056,
        n_train=1_778_351,
        n_test=587_084,
        avg_labels=3.19,
        avg_nnz=42.0,
        label_offset=50.0,
    ),
    # the shape of a held-out set of the maintainers' (WordNet glosses: short rows, three
    # quarters of the labels seen at most 3 times), for timing: its data are random
    "rare-148k": SyntheticSpec(
        n_features=141_000,
        n_labels=148_000,
        n_train=94_000,
        n_test=5_000,
        avg_labels=3.8,
        avg_nnz=20.0,
        label_offset=50.0,
        label_zipf=0.6,
    ),
    "delicious-200k": SyntheticSpec(
        n_features=782_585,
        n_labels=205_443,
        n_train=196_606,
        n_test=100_095,
        avg_labels=75.54,
        avg_nnz=300.0,
        label_offset=20.0,
    ),
}


def resolve_spec(preset_or_spec: str | SyntheticSpec, **overrides: Any) -> SyntheticSpec:
    """A preset name or a spec, with fields replaced by ``overrides`` (validated)."""
    if isinstance(preset_or_spec, SyntheticSpec):
        spec = preset_or_spec
    elif isinstance(preset_or_spec, str) and preset_or_spec in PRESETS:
        spec = PRESETS[preset_or_spec]
    else:
        raise ValueError(
            f"unknown synthetic preset {preset_or_spec!r}; choose from {sorted(PRESETS)}"
        )
    fields = {f.name for f in dataclasses.fields(SyntheticSpec)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown SyntheticSpec field(s) {unknown}; fields are {sorted(fields)}")
    return dataclasses.replace(spec, **overrides) if overrides else spec


def make_synthetic(
    spec: str | SyntheticSpec, seed: int = 0, n_threads: int | None = None
) -> tuple[XCDataset, XCDataset]:
    """Generate a synthetic data set in memory.

    Parameters
    ----------
    spec : str or SyntheticSpec
        A preset name (``'tiny'``, ``'small'``, ``'amazon-670k'``...; see ``PRESETS``)
        or a spec (:func:`resolve_spec` makes one from a preset and changes).
    seed : int, default=0
        The same seed gives identical arrays.
    n_threads : int or None, default=None
        numba threads to generate with. None: as numba is set.

    Returns
    -------
    train, test : XCDataset
        The training and test points.
    """
    spec = resolve_spec(spec)
    gen = _Generator(spec, seed)
    out = []
    for split, n in ((_TRAIN, spec.n_train), (_TEST, spec.n_test)):
        chunks = list(ordered_map(gen.chunk, gen.chunk_args(split, n), n_threads))
        out.append(_concat(chunks, spec))
    return out[0], out[1]


def generate(
    spec_or_preset: str | SyntheticSpec,
    out_url: str,
    seed: int = 0,
    storage_options: dict | None = None,
    n_threads: int | None = None,
) -> dict[str, str]:
    """Write ``train.txt`` and ``test.txt`` (XC text) under the folder ``out_url`` (a
    local path or fsspec URL); returns ``{"train": url, "test": url}``.

    Streams chunk by chunk: memory stays small whatever the data set size. The files
    hold exactly what :func:`make_synthetic` returns for the same spec and seed.
    """
    import fsspec

    spec = resolve_spec(spec_or_preset)
    so = storage_options or {}
    fs, root = fsspec.core.url_to_fs(out_url, **so)
    fs.makedirs(root, exist_ok=True)
    gen = _Generator(spec, seed)
    urls = {}
    for name, split, n in (("train", _TRAIN, spec.n_train), ("test", _TEST, spec.n_test)):
        url = out_url.rstrip("/") + f"/{name}.txt"
        with fsspec.open(url, "wb", **so) as f:
            f.write(f"{n} {spec.n_features} {spec.n_labels}\n".encode())
            for text in ordered_map(gen.chunk_text, gen.chunk_args(split, n), n_threads):
                f.write(text)
        urls[name] = url
    return urls


class _Generator:
    """The label/feature structure of one (spec, seed), shared by train and test."""

    def __init__(self, spec: SyntheticSpec, seed: int) -> None:
        self.spec = spec
        self.seed = int(seed)
        s = spec
        sd = lambda tag: np.uint64(derive_seed(self.seed, 0, tag))  # noqa: E731
        # labels: Zipf-Mandelbrot popularity, random rank -> id
        ranks = np.arange(1, s.n_labels + 1, dtype=np.float64)
        lab_w = np.empty(s.n_labels)
        lab_w[K.permutation(s.n_labels, sd(1))] = (ranks + s.label_offset) ** -s.label_zipf
        lab_w /= lab_w.sum()
        self.lab_alias = K.build_alias(lab_w)
        # topics: an even random split of the labels
        topic = K.permutation(s.n_labels, sd(2)) % s.topics
        order = np.argsort(topic, kind="stable")
        self.topic_labels = order.astype(np.int32)
        self.topic_ptr = np.zeros(s.topics + 1, np.int64)
        np.cumsum(np.bincount(topic, minlength=s.topics), out=self.topic_ptr[1:])
        self.topic_cum = np.cumsum(lab_w[order])
        self.topic_alias = K.build_alias(np.bincount(topic, weights=lab_w, minlength=s.topics))
        # features: background Zipf (noise) and signature distribution, random orders
        franks = np.arange(1, s.n_features + 1, dtype=np.float64)
        bg_w = np.empty(s.n_features)
        bg_w[K.permutation(s.n_features, sd(3))] = franks**-s.feature_zipf
        bg_w /= bg_w.sum()
        self.bg_alias = K.build_alias(bg_w)
        sig_w = np.empty(s.n_features)
        sig_w[K.permutation(s.n_features, sd(4))] = franks**-s.sig_zipf
        self.sig = K.make_signatures(s.n_labels, sd(5), s.sig_min, s.sig_max, *K.build_alias(sig_w))
        # idf from the expected document frequency of background draws
        df = -np.expm1(-s.avg_nnz * max(1.0 - s.signal_frac, 0.05) * bg_w)
        self.idf = 1.0 + np.log(1.0 / np.maximum(df, 1e-300))
        self.extra_labels = s.avg_labels / (1.0 - s.empty_frac) - 1.0
        self.nnz_mu = math.log(s.avg_nnz) - s.nnz_sigma**2 / 2

    def chunk_args(self, split: int, n_points: int) -> list[tuple[int, int]]:
        """(seed, points kept) of each chunk of a split."""
        return [
            (derive_seed(self.seed, split, c), min(CHUNK_POINTS, n_points - start))
            for c, start in enumerate(range(0, n_points, CHUNK_POINTS))
        ]

    def chunk(self, args: tuple[int, int]) -> tuple[np.ndarray, ...]:
        """The first ``n`` points of a chunk. A chunk is always drawn whole (a chunk's
        row sizes come first in its random stream), so fewer points give a prefix."""
        seed, n = args
        y_ptr, y_idx, x_ptr, x_idx, x_val = self._whole_chunk(seed)
        if n == CHUNK_POINTS:
            return y_ptr, y_idx, x_ptr, x_idx, x_val
        y_ptr, x_ptr = y_ptr[: n + 1], x_ptr[: n + 1]
        return y_ptr, y_idx[: y_ptr[-1]], x_ptr, x_idx[: x_ptr[-1]], x_val[: x_ptr[-1]]

    def _whole_chunk(self, seed: int) -> tuple[np.ndarray, ...]:
        s = self.spec
        return K.generate_chunk(
            np.uint64(seed),
            CHUNK_POINTS,
            s.empty_frac,
            max(0.0, self.extra_labels),
            max(1, s.n_labels // 2),
            self.nnz_mu,
            s.nnz_sigma,
            max(1, s.n_features // 2),
            s.signal_frac,
            s.topic_mix,
            *self.lab_alias,
            *self.topic_alias,
            self.topic_ptr,
            self.topic_labels,
            self.topic_cum,
            *self.sig,
            *self.bg_alias,
            self.idf,
        )

    def chunk_text(self, args: tuple[int, int]) -> np.ndarray:
        y_ptr, y_idx, x_ptr, x_idx, x_val = self.chunk(args)
        return format_rows(x_ptr, x_idx, x_val, y_ptr, y_idx, 0, len(x_ptr) - 1)


def _concat(chunks: list[tuple[np.ndarray, ...]], spec: SyntheticSpec) -> XCDataset:
    def stack(ptrs: list[np.ndarray]) -> np.ndarray:
        out = [np.zeros(1, np.int64)]
        base = 0
        for p in ptrs:
            out.append(p[1:] + base)
            base += p[-1]
        return np.concatenate(out)

    y_ptr = stack([c[0] for c in chunks])
    x_ptr = stack([c[2] for c in chunks])

    def cat(i: int, dtype: type) -> np.ndarray:
        return np.concatenate([c[i] for c in chunks]) if chunks else np.zeros(0, dtype)

    X = CSR(x_ptr, cat(3, np.int32), cat(4, np.float32), spec.n_features)
    Y = CSR(y_ptr, cat(1, np.int32), None, spec.n_labels)
    return XCDataset(X, Y)

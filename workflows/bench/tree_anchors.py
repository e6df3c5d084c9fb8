"""Label trees as anchors of ``dslide bench topk``: what users would serve instead.

omikuji (Parabel-style trees), napkinXC (probabilistic label trees) and PECOS XR-Linear
(where its numpy and scipy pins hold: an environment of its own), each with its default
hyper-parameters and where installed, are trained on the model's own training
rows (``--trees TRAIN``, the XC text file: omikuji's only input, so a local file), then
answer the benchmark's rows with their own tree search, one row a call from Python as
their APIs serve them, on the benchmark's thread count. Rows are converted to each
library's input before the clock starts, as the network's are parsed before theirs. The
trees do not retrieve the network's top k, so they have no recall: their P@1 on the rows'
labels stands beside the network's.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def local_text(url: str) -> Path:
    """The local file ``--trees`` names (omikuji reads only local XC text files)."""
    path = Path(url.removeprefix("file://"))
    if "://" in url and not url.startswith("file://"):
        raise ValueError(f"--trees {url}: omikuji reads local files only")
    if not path.is_file():
        raise ValueError(f"--trees {url}: no such file")
    return path


def tree_anchors(train: Path, X, k: int, threads: int, latency_rows: int, repeat: int):
    """The rows of the label-tree libraries installed (omikuji, napkinXC), or a
    ValueError saying how to install them when neither is."""
    import importlib.util

    from dslide_workflows.bench.trees import pecos_conflict

    found = [name for name in ("omikuji", "napkinxc", "pecos") if importlib.util.find_spec(name)]
    if "pecos" in found and pecos_conflict():
        print(f"pecos left out: {pecos_conflict()}")
        found.remove("pecos")
    if not found:
        raise ValueError(
            "--trees needs omikuji or napkinXC: pip install 'dslide-dask[bench-trees]'"
        )
    build = {"omikuji": _omikuji, "napkinxc": _napkinxc, "pecos": _pecos}
    rows = []
    for name in found:
        print(f"training {name} on", train, "...", flush=True)
        with build[name](train, X, threads) as (seconds, queries, answer):
            rows.append(_timed(name, seconds, queries, answer, k, latency_rows, repeat))
    return rows


@contextlib.contextmanager
def _omikuji(train: Path, X, threads: int):
    """omikuji trained on every core: ``(seconds, queries, answer(query, k) -> ids)``."""
    import omikuji

    from dslide_workflows.bench.trees import omikuji_rows, silenced

    t0 = time.perf_counter()
    with silenced():  # its Rust side draws a progress bar
        model = omikuji.Model.train_on_data(str(train), omikuji.Model.default_hyper_param())
    seconds = time.perf_counter() - t0
    model.init_prediction_thread_pool(threads)
    yield seconds, omikuji_rows(X), lambda q, k: [label for label, _ in model.predict(q, top_k=k)]


@contextlib.contextmanager
def _napkinxc(train: Path, X, threads: int):
    """napkinXC's PLT trained on every core, answering on ``threads``."""
    from napkinxc.models import PLT

    from dslide_dask.data.xc_text import read_xc
    from dslide_workflows.bench.trees import scipy_csr

    data = read_xc(str(train))
    features = scipy_csr(data.X)
    labels = [data.Y.row(i).tolist() for i in range(data.n_points)]
    with tempfile.TemporaryDirectory(prefix="dslide-napkinxc-") as out:
        model = PLT(out, threads=os.cpu_count() or 1, seed=0)
        t0 = time.perf_counter()
        model.fit(features, labels)
        seconds = time.perf_counter() - t0
        model.set_params(threads=threads)
        rows = scipy_csr(X)
        queries = [rows[i] for i in range(rows.shape[0])]
        yield seconds, queries, lambda q, k: model.predict(q, top_k=k)[0]


@contextlib.contextmanager
def _pecos(train: Path, X, threads: int):
    """PECOS XR-Linear (its quick start's settings) trained on every core, answering one
    row at a time by beam search (beam 10) on ``threads``."""
    from dslide_dask.data.xc_text import read_xc
    from dslide_workflows.bench.trees import scipy_csr, train_pecos

    data = read_xc(str(train))
    t0 = time.perf_counter()
    model = train_pecos(data, os.cpu_count() or 1, 0)
    seconds = time.perf_counter() - t0
    rows = scipy_csr(X, np.float32)
    queries = [rows[i] for i in range(rows.shape[0])]

    def answer(q, k: int) -> np.ndarray:
        scores = model.predict(q, beam_size=10, only_topk=k, threads=threads).tocsr()
        return scores.indices[np.argsort(-scores.data, kind="stable")]

    yield seconds, queries, answer


def _timed(name: str, build: float, queries: list, answer, k: int, latency_rows: int, repeat: int):
    """A tree library's row of the benchmark: top-``k`` ids of ``queries`` answered one
    call a row, rows/s (best of ``repeat``), one-row latency p50/p99, and its training
    seconds on every core as ``build_s``."""
    ids = np.full((len(queries), k), -1, np.int64)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        answers = [answer(q, k) for q in queries]
        best = min(best, time.perf_counter() - t0)
    for i, found in enumerate(answers):
        ids[i, : len(found)] = found[:k]
    lat = np.empty(min(latency_rows, len(queries)))
    for i in range(len(lat)):
        t0 = time.perf_counter()
        answer(queries[i], k)
        lat[i] = time.perf_counter() - t0
    row = {
        "setting": name,
        "anchor": True,
        "ids": ids,
        "scored_per_row": float("nan"),
        "rows_per_s": len(queries) / best,
        "build_s": build,
    }
    if len(lat):
        row.update(
            latency_ms_p50=float(np.median(lat) * 1e3),
            latency_ms_p99=float(np.quantile(lat, 0.99) * 1e3),
        )
    return row

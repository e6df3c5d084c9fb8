"""Label trees as anchors of ``dslide bench topk``: what users would serve instead.

omikuji (Parabel-style trees, default hyper-parameters) is trained on the model's own
training rows (``--trees TRAIN``, the XC text file: omikuji's only input, so a local
file), then answers the benchmark's rows with its own beam search, one row a call from
Python as its API serves them, on the benchmark's thread count. Its rows are converted
to omikuji's input before the clock starts, as the network's are parsed before theirs.
It does not retrieve the network's top k, so it has no recall: its P@1 on the rows'
labels stands beside the network's.
"""

from __future__ import annotations

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


def omikuji_anchor(train: Path, X, k: int, threads: int, latency_rows: int, repeat: int):
    """omikuji's row of the benchmark: top-``k`` ids of the rows of ``X`` (CSR), rows/s
    answering them one call a row, one-row latency p50/p99, and its training seconds on
    every core as ``build_s``."""
    try:
        import omikuji
    except ImportError:
        raise ValueError("--trees needs omikuji: pip install 'dslide-dask[bench-trees]'") from None
    from dslide_workflows.bench.trees import omikuji_rows, silenced

    t0 = time.perf_counter()
    with silenced():  # its Rust side draws a progress bar
        model = omikuji.Model.train_on_data(str(train), omikuji.Model.default_hyper_param())
    build = time.perf_counter() - t0
    model.init_prediction_thread_pool(threads)
    queries = omikuji_rows(X)
    ids = np.full((len(queries), k), -1, np.int64)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        answers = [model.predict(q, top_k=k) for q in queries]
        best = min(best, time.perf_counter() - t0)
    for i, answer in enumerate(answers):
        ids[i, : len(answer)] = [label for label, _ in answer]
    lat = np.empty(min(latency_rows, len(queries)))
    for i in range(len(lat)):
        t0 = time.perf_counter()
        model.predict(queries[i], top_k=k)
        lat[i] = time.perf_counter() - t0
    row = {
        "setting": "omikuji",
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

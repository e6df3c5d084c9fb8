"""How ``dslide bench topk`` times an answer: rows/s in batches and one row at a time."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def timed_answers(
    answer: Callable, X, batch: int, repeat: int, latency_rows: int
) -> dict[str, object]:
    """``answer(rows) -> ids`` timed: its ids of every row of ``X``, rows/s answering
    batches of ``batch`` rows (best of ``repeat``), and the latency of answering one row
    at a time (p50, p99 over the first ``latency_rows``). A first row is answered before
    the clock starts (compilation)."""
    answer(X.slice_rows(0, 1))
    ids, best = None, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        parts = [
            answer(X.slice_rows(start, min(start + batch, X.n_rows)))
            for start in range(0, X.n_rows, batch)
        ]
        best = min(best, time.perf_counter() - t0)
        ids = np.concatenate(parts)
    out: dict[str, object] = {"ids": ids, "rows_per_s": X.n_rows / best}
    lat = np.empty(min(latency_rows, X.n_rows))
    for i in range(len(lat)):
        row = X.slice_rows(i, i + 1)
        t0 = time.perf_counter()
        answer(row)
        lat[i] = time.perf_counter() - t0
    if len(lat):
        out.update(
            latency_ms_p50=float(np.median(lat) * 1e3),
            latency_ms_p99=float(np.quantile(lat, 0.99) * 1e3),
        )
    return out

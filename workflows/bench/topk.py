"""``dslide bench topk``: recall@k and speed of the LSH top-k against the exact top-k.

Loads a trained model (``--model``: a checkpoint, a saved model or a run folder, e.g.
``dslide train --run-dir``'s) in this process, reads ``--rows`` rows of ``--data`` and,
on ``--threads`` numba threads (default 1: one core):

- exact: every label scored (blocked matrix products and a streaming top-k);
- each ``--setting T:C``: the LSH top-k probing the first T tables (0: all) and scoring
  at most C candidates per shard (0: all found), those found in the most tables.

For each: recall@k against the exact top-k (the share of the exact k found), rows/s
scoring the rows in batches of ``--batch`` (throughput), and the latency of answering
one row at a time (median and p99 over ``--latency-rows`` rows: hidden layers, every
shard, the merge), and the mean candidates scored per row. ``--index K=V`` gives the
model new tables for serving first (e.g. ``L=100``, ``K=8``), ``--mips`` SimHash tables
under the inner-product transform: training's tables are built for sampling. Each
timing is the best of ``--repeat`` runs; run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dslide_workflows.args import add_storage_arguments, key_value, positive_int, storage_options

SUMMARY = "recall@k and rows/s of the LSH top-k against the exact top-k, per setting"


def setting(text: str) -> tuple[int, int]:
    """``T:C`` -> (tables, candidates)."""
    try:
        tables, candidates = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TABLES:CANDIDATES, got {text!r}") from None
    if tables < 0 or candidates < 0:
        raise argparse.ArgumentTypeError(f"tables and candidates must be >= 0, got {text!r}")
    return tables, candidates


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="URL", help="trained model")
    p.add_argument("--data", required=True, metavar="URL", help="rows to query (XC text)")
    p.add_argument("--rows", type=positive_int, default=2000, help="rows used (default: 2000)")
    p.add_argument("--k", type=positive_int, default=5, help="(default: 5)")
    p.add_argument("--setting", type=setting, action="append", default=[], metavar="T:C",
                   help="LSH tables probed : candidates scored, 0 = all (repeatable; "
                   "default: 0:0 and a few cuts)")  # fmt: skip
    p.add_argument("--index", type=key_value, action="append", default=[], metavar="K=V",
                   help="serving tables: L, K, range_pow, bucket_capacity...")  # fmt: skip
    p.add_argument("--mips", action="store_true",
                   help="serving tables: SimHash under the inner-product transform")  # fmt: skip
    p.add_argument("--threads", type=positive_int, default=1, help="numba threads (default: 1)")
    p.add_argument("--batch", type=positive_int, default=256, help="rows a batch (default: 256)")
    p.add_argument("--latency-rows", type=int, default=200, metavar="N",
                   help="rows answered one at a time (default: 200; 0: skip)")  # fmt: skip
    p.add_argument("--repeat", type=positive_int, default=3, help="best of N (default: 3)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results")
    add_storage_arguments(p)


DEFAULT_SETTINGS = ((0, 0), (0, 2000), (0, 500), (10, 0), (10, 500))


def run(args: argparse.Namespace) -> int:
    import numba

    from dslide_dask.checkpoint.model import load_network
    from dslide_dask.data.source import read_dataset
    from dslide_dask.inference import PredictSpec, predict_topk_scores
    from dslide_dask.inference.model_cache import resolve
    from dslide_dask.inference.recall import recall_at_k
    from dslide_dask.inference.serving import reindex
    from dslide_dask.model.lsh_index import LSHQuery

    so = storage_options(args.storage_option)
    ckpt = resolve(args.model, so)
    net = load_network(ckpt)
    reindex(net, args.mips, **dict(args.index))
    data, _ = read_dataset(args.data, so)
    if data.n_features != net.n_features:
        raise ValueError(
            f"{args.data}: {data.n_features} features, the model {ckpt.url} takes {net.n_features}"
        )
    if args.k > net.n_labels:
        raise ValueError(f"--k must be at most the model's {net.n_labels} labels, got {args.k}")
    X = data.X.slice_rows(0, min(args.rows, data.n_points))
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    index = net.shards[0].serving_tables()
    print(f"model {ckpt.url}: {net.n_features} features, {net.n_labels} labels, "
          f"{len(net.shards)} shard(s); tables L={index.cfg.L} K={index.cfg.K} "
          f"2^{index.range_pow} buckets x {index.cfg.bucket_capacity}; {X.n_rows} rows, "
          f"{args.threads} thread(s){', MIPS tables' if args.mips else ''}")  # fmt: skip

    def measure(spec: PredictSpec) -> dict:
        predict_topk_scores(net, X.slice_rows(0, 1), spec)  # compile
        ids, best = None, float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            ids, _ = predict_topk_scores(net, X, spec, batch_size=args.batch)
            best = min(best, time.perf_counter() - t0)
        out = {"ids": ids, "rows_per_s": X.n_rows / best}
        n_lat = min(args.latency_rows, X.n_rows)
        if n_lat:
            lat = np.empty(n_lat)
            for i in range(n_lat):
                row = X.slice_rows(i, i + 1)
                t0 = time.perf_counter()
                predict_topk_scores(net, row, spec)
                lat[i] = time.perf_counter() - t0
            out.update(latency_ms_p50=float(np.median(lat) * 1e3),
                       latency_ms_p99=float(np.quantile(lat, 0.99) * 1e3))  # fmt: skip
        return out

    exact = measure(PredictSpec(ckpt.url, k=args.k))
    rows = [{"setting": "exact", "tables": None, "candidates": None, "recall": 1.0,
             "scored_per_row": float(net.n_labels), **exact}]  # fmt: skip
    h, _ = net.hidden.forward(X)
    for tables, candidates in args.setting or DEFAULT_SETTINGS:
        spec = PredictSpec(ckpt.url, k=args.k, exact=False, tables=tables, candidates=candidates)
        res = measure(spec)
        query = LSHQuery(args.k, tables, candidates)
        scored = sum(
            float(s.serving_tables().search(h, s.W, s.bias, query)[2].mean()) for s in net.shards
        )  # fmt: skip
        rows.append({"setting": f"{tables}:{candidates}", "tables": tables,
                     "candidates": candidates, "recall": recall_at_k(res["ids"], exact["ids"]),
                     "scored_per_row": scored, **res})  # fmt: skip
    for r in rows:
        r.pop("ids")
        r["speedup"] = r["rows_per_s"] / rows[0]["rows_per_s"]
    print(table(rows, args.k))
    if args.json:
        meta = {"model": ckpt.url, "data": args.data, "rows": X.n_rows, "k": args.k,
                "threads": args.threads, "index": dict(args.index), "mips": args.mips,
                "n_labels": net.n_labels}  # fmt: skip
        args.json.write_text(json.dumps({**meta, "results": rows}, indent=1))
    return 0


def table(rows: list[dict], k: int) -> str:
    head = (f"{'setting T:C':<14}{'recall@' + str(k):>10}{'scored/row':>12}{'rows/s':>11}"
            f"{'x exact':>9}{'p50 ms':>9}{'p99 ms':>9}")  # fmt: skip
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['setting']:<14}{r['recall']:>10.4f}{r['scored_per_row']:>12.0f}"
            f"{r['rows_per_s']:>11.0f}{r['speedup']:>9.2f}"
            f"{r.get('latency_ms_p50', float('nan')):>9.3f}"
            f"{r.get('latency_ms_p99', float('nan')):>9.3f}"
        )
    return "\n".join(lines)

"""``dslide bench topk``: recall and speed of the serving top-k paths against the exact one.

Loads a trained model (``--model``: a checkpoint, a saved model or a run folder, e.g.
``dslide train --run-dir``'s) in this process, reads ``--rows`` rows of ``--data`` and,
on ``--threads`` threads (numba's and faiss's; default 1: one core):

- exact: every label scored (blocked matrix products and a streaming top-k);
- each ``--setting T:C``: the LSH top-k probing the first T tables (0: all) and scoring
  at most C candidates per shard (0: all found), those found in the most tables;
- the output index (``docs/serving.md``): the model's stored one (``dslide index``), else
  one built here (``--index-setting K=V``: its settings; build seconds reported), searched
  with each ``--probes P`` (default: as built); its candidates are scored exactly.
  ``--no-index`` leaves it out (it needs faiss: ``pip install "dslide-dask[serve]"``).

A model saved with neighbours (the default) also gets its whole answer timed, the
network's candidates and the neighbours' votes fused, exactly and through the serving
indexes, the latter's recall against the former (:mod:`dslide_workflows.bench.topk_fused`;
``--no-fused`` leaves them out).

``--trees TRAIN`` adds omikuji, napkinXC and PECOS XR-Linear (those installed), trained
on the model's training rows (a local XC text file), answering the same rows with their
own tree search: anchors, what users would serve instead
(:mod:`dslide_workflows.bench.tree_anchors`).

For each: P@1 on the rows' labels, recall@1 and recall@k against the exact top-k (the
share of the exact best k found; none for the trees), rows/s scoring the rows in
batches of ``--batch`` (throughput), the latency of answering one row at a time (median
and p99 over ``--latency-rows`` rows: hidden layers, every shard, the merge), the mean
candidates scored per row, and for the index (and the trees) its build seconds (and
bytes). ``--table K=V`` gives the model new LSH tables for serving first (e.g. ``L=100``,
``K=8``), ``--mips`` SimHash tables under the inner-product transform: training's tables
are built for sampling. ``--plot PNG`` draws recall@k against the one-row latency of
every contender. Each timing is the best of ``--repeat`` runs; run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dslide_workflows.args import (
    add_storage_arguments,
    add_table_arguments,
    key_value,
    positive_int,
    storage_options,
)

SUMMARY = "recall@k and speed of the LSH top-k and the output index against the exact top-k"


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
    p.add_argument(
        "--setting",
        type=setting,
        action="append",
        default=[],
        metavar="T:C",
        help="LSH tables probed : candidates scored, 0 = all (repeatable; "
        "default: 0:0 and a few cuts)",
    )
    add_table_arguments(p)
    p.add_argument(
        "--index-setting",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="build the output index here with these settings "
        "(lists, probes, candidates, codes...; default: the stored index, else "
        "chosen for the layer)",
    )
    p.add_argument(
        "--probes",
        type=positive_int,
        action="append",
        default=[],
        metavar="P",
        help="output index: lists probed a query (repeatable; default: as built)",
    )
    p.add_argument("--no-index", action="store_true", help="leave the output index out")
    p.add_argument(
        "--trees",
        default=None,
        metavar="TRAIN",
        help="also omikuji, napkinXC and PECOS (those installed), trained on this local XC text "
        "file (the model's training rows), answering the same rows: anchors",
    )
    p.add_argument(
        "--no-fused",
        action="store_true",
        help="leave out the whole answer of a model with neighbours (network and votes "
        "fused, exact and through the serving indexes)",
    )
    p.add_argument("--threads", type=positive_int, default=1, help="threads (default: 1)")
    p.add_argument("--batch", type=positive_int, default=256, help="rows a batch (default: 256)")
    p.add_argument(
        "--latency-rows",
        type=int,
        default=200,
        metavar="N",
        help="rows answered one at a time (default: 200; 0: skip)",
    )
    p.add_argument("--repeat", type=positive_int, default=3, help="best of N (default: 3)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="recall@k against one-row latency, every contender",
    )
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
    from dslide_dask.metrics import precision_at_k
    from dslide_dask.model.lsh_index import LSHQuery
    from dslide_workflows.bench.latency import timed_answers

    so = storage_options(args.storage_option)
    ckpt = resolve(args.model, so)
    net = load_network(ckpt)
    reindex(net, args.mips, **dict(args.table))
    data, _ = read_dataset(args.data, so)
    if data.n_features != net.n_features:
        raise ValueError(
            f"{args.data}: {data.n_features} features, the model {ckpt.url} takes {net.n_features}"
        )
    if args.k > net.n_labels:
        raise ValueError(f"--k must be at most the model's {net.n_labels} labels, got {args.k}")
    X = data.X.slice_rows(0, min(args.rows, data.n_points))
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    index = net.shards[0].serving_tables()
    print(
        f"model {ckpt.url}: {net.n_features} features, {net.n_labels} labels, "
        f"{len(net.shards)} shard(s); tables L={index.cfg.L} K={index.cfg.K} "
        f"2^{index.range_pow} buckets x {index.cfg.bucket_capacity}; {X.n_rows} rows, "
        f"{args.threads} thread(s){', MIPS tables' if args.mips else ''}"
    )

    def measure(spec: PredictSpec) -> dict:
        def answer(rows):
            return predict_topk_scores(net, rows, spec, batch_size=args.batch)[0]

        return timed_answers(answer, X, args.batch, args.repeat, args.latency_rows)

    h, _ = net.hidden.forward(X)

    def served(name: str, spec: PredictSpec, **extra) -> dict:
        """A serving contender's row: its figures, and the candidates scored a row."""
        res = measure(spec)
        query = LSHQuery(args.k, spec.tables, spec.candidates)
        scored = sum(
            float(s.serving_tables().search(h, s.W, s.bias, query)[2].mean()) for s in net.shards
        )
        return {"setting": name, "scored_per_row": scored, **extra, **res}

    rows = [
        {
            "setting": "exact",
            "tables": None,
            "candidates": None,
            "scored_per_row": float(net.n_labels),
            **measure(PredictSpec(ckpt.url, k=args.k)),
        }
    ]
    for tables, candidates in args.setting or DEFAULT_SETTINGS:
        spec = PredictSpec(ckpt.url, k=args.k, exact=False, tables=tables, candidates=candidates)
        rows.append(served(f"{tables}:{candidates}", spec, tables=tables, candidates=candidates))
    if not args.no_index:
        for built, probes in output_indexes(args, ckpt, net):
            spec = PredictSpec(ckpt.url, k=args.k, exact=False, output_index=True)
            rows.append(served(f"index p={probes}", spec, probes=probes, **built))
    if args.trees:
        from dslide_workflows.bench.tree_anchors import local_text, tree_anchors

        train = local_text(args.trees)
        rows += tree_anchors(train, X, args.k, args.threads, args.latency_rows, args.repeat)
    if not args.no_fused:
        from dslide_workflows.bench.topk_fused import fused_rows

        rows += fused_rows(ckpt.url, so, X, args.k, args)
    exact, labels = rows[0]["ids"], data.Y.slice_rows(0, X.n_rows)
    for r in rows:
        ids = r.pop("ids")
        anchor = r.get("anchor", False)
        r["P@1"] = precision_at_k(ids, labels, (1,))["P@1"]
        if "recall" not in r:  # the fused rows': against the fused exact answer
            r["recall"] = float("nan") if anchor else recall_at_k(ids, exact)
            r["recall@1"] = float("nan") if anchor else recall_at_k(ids[:, :1], exact[:, :1])
        r["speedup"] = r["rows_per_s"] / rows[0]["rows_per_s"]
    print(table(rows, args.k))
    if args.json:
        meta = {
            "model": ckpt.url,
            "data": args.data,
            "rows": X.n_rows,
            "k": args.k,
            "threads": args.threads,
            "table": dict(args.table),
            "mips": args.mips,
            "n_labels": net.n_labels,
        }
        args.json.write_text(json.dumps({**meta, "results": rows}, indent=1))
    if args.plot:
        plot(rows, args.k, args.plot, f"{net.n_labels:,} labels, {args.threads} thread(s)")
    return 0


def output_indexes(args: argparse.Namespace, ckpt, net):
    """``(figures, probes)`` for each probe count asked, with the output index attached
    to the network's shards: the stored one, or one built here (timed)."""
    from dslide_dask.checkpoint.label_counts import load_label_counts
    from dslide_dask.checkpoint.output_index import has_output_index, load_output_index
    from dslide_dask.model.output_index import IndexSettings, OutputIndex, faiss_module

    try:
        faiss_module()
    except ImportError as err:
        print(f"output index: left out ({err})")
        return
    t0 = time.perf_counter()
    if has_output_index(ckpt) and not args.index_setting:
        index, how = load_output_index(ckpt), "stored"
    else:
        labels = load_label_counts(ckpt, storage_options(args.storage_option))
        counts = None if labels is None else labels.counts
        index = OutputIndex.build(net.shards, IndexSettings.of(dict(args.index_setting)), counts)
        how = "built"
    seconds = time.perf_counter() - t0
    layer = sum(s.W.nbytes + s.bias.nbytes for s in net.shards)
    s = index.settings
    print(
        f"output index ({how} in {seconds:.1f} s): {s.lists} lists, {s.candidates} "
        f"candidates, {s.codes}, {index.nbytes / 1e6:.1f} MB ({index.nbytes / layer:.2f} "
        f"x the layer's {layer / 1e6:.1f} MB)"
    )
    built = {
        "candidates": s.candidates,
        "index": how,
        "bytes": index.nbytes,
        "bytes_vs_layer": index.nbytes / layer,
        "build_s" if how == "built" else "load_s": seconds,
    }
    for probes in args.probes or [s.probes]:
        index.with_probes(probes).attach(net.shards)
        yield built, probes


def table(rows: list[dict], k: int) -> str:
    head = (
        f"{'setting':<16}{'P@1':>7}{'recall@1':>9}{'recall@' + str(k):>10}{'scored/row':>12}"
        f"{'rows/s':>11}{'x exact':>9}{'p50 ms':>9}{'p99 ms':>9}{'build s':>9}{'MB':>8}"
    )
    lines = [head]
    nan = float("nan")
    for r in rows:
        lines.append(
            f"{r['setting']:<16}{r['P@1']:>7.4f}{r['recall@1']:>9.4f}{r['recall']:>10.4f}"
            f"{r['scored_per_row']:>12.0f}{r['rows_per_s']:>11.0f}{r['speedup']:>9.2f}"
            f"{r.get('latency_ms_p50', nan):>9.3f}{r.get('latency_ms_p99', nan):>9.3f}"
            f"{r.get('build_s', nan):>9.1f}{r.get('bytes', nan) / 1e6:>8.1f}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], k: int, out: Path, title: str) -> None:
    """recall@k (y) against one-row p50 latency (x, log) of every contender; an anchor
    (no recall) as a dashed line at its latency, with its P@1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if "latency_ms_p50" not in r:
            continue
        if r.get("anchor"):
            label = f"{r['setting']} (P@1 {r['P@1']:.3f})"
            ax.axvline(r["latency_ms_p50"], linestyle="--", color="grey", label=label)
        else:
            ax.scatter(r["latency_ms_p50"], r["recall"], label=r["setting"])
    ax.set_xscale("log")
    ax.set_xlabel("one row, p50 ms")
    ax.set_ylabel(f"recall@{k} against exact")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)

"""Training curves as a PNG, and ``dslide report RUN``: what a run folder says."""

from __future__ import annotations

import argparse
import io
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from dslide_workflows.args import add_storage_arguments, storage_options
from dslide_workflows.run_folder import RunFolder


def curves_drawing(records: list[dict], title: str = "") -> Future:
    """:func:`plot_curves` on a thread of its own: matplotlib takes 0.75 s, as long as
    a LocalCluster takes to close."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="curves")
    try:
        return pool.submit(plot_curves, records, title)
    finally:
        pool.shutdown(wait=False)


def plot_curves(records: list[dict], title: str = "") -> bytes:
    """PNG of the loss (and its moving average) and of P@k against steps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [r for r in records if r.get("kind", "step") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig = Figure(figsize=(10, 3.8), dpi=100, layout="constrained")
    loss_ax, p_ax = fig.subplots(1, 2)
    if steps:
        x = np.array([r["step"] for r in steps])
        loss = np.array([r["loss"] for r in steps], float)
        loss_ax.plot(x, loss, color="0.75", linewidth=0.8, label="per step")
        window = max(1, len(loss) // 50)
        if window > 1:
            smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
            loss_ax.plot(x[window - 1 :], smooth, color="C0", label=f"mean of {window}")
        loss_ax.legend(loc="upper right")
    loss_ax.set(xlabel="step", ylabel="loss", title="training loss")
    for k in ("P@1", "P@3", "P@5"):
        points = [(r["step"], r[k]) for r in evals if k in r]
        if points:
            p_ax.plot(*zip(*points, strict=True), marker="o", label=k)
    if evals:
        p_ax.legend(loc="lower right")
    p_ax.set(xlabel="step", ylabel="precision", title="test precision")
    if title:
        fig.suptitle(title)
    out = io.BytesIO()
    FigureCanvasAgg(fig).print_png(out)
    return out.getvalue()


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="print a run folder's summary and evaluations; redraw its curves",
        description="Read RUN (a folder written by dslide train, any fsspec URL): print "
        "its settings, summary and evaluations, and draw its curves (--plot FILE, or "
        "RUN/curves.png again).",
    )
    p.add_argument("run", metavar="RUN", help="run folder (path or URL)")
    p.add_argument("--plot", metavar="PNG", help="write the curves here (default: RUN/curves.png)")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    folder = RunFolder(args.run, storage_options(args.storage_option))
    config = folder.read_config()
    records = folder.read_metrics()
    steps = [r for r in records if r.get("kind") == "step"]
    print(f"run {folder.url}")
    model = config.get("model", {})
    data = config.get("train") or f"preset {config.get('preset')}"
    print(
        f"  data {data}; hidden {model.get('hidden')}, lr {model.get('lr')}, "
        f"epochs {config.get('epochs')}, batch {config.get('batch_size')}"
    )
    summary = folder.read_summary()
    if summary is not None:
        print(summary.rstrip())
    else:
        last = steps[-1]["step"] if steps else 0
        print(f"  unfinished: {len(steps)} steps recorded, last step {last}")
    for r in records:
        if r.get("kind") == "eval":
            scores = "  ".join(f"{k} {v:.4f}" for k, v in r.items() if k.startswith("P@"))
            print(f"  eval step {r['step']:<6} {scores}")
    png = plot_curves(records, folder.url)
    if args.plot:
        with open(args.plot, "wb") as f:
            f.write(png)
        print(f"curves: {args.plot}")
    else:
        folder.write_plot(png)
        print(f"curves: {folder.child_url('curves.png')}")
    return 0

"""``dslide bench accuracy``'s report: the table of every contender's last point, each
curve's P@1 by epoch (or member), and the plot of P@1 against training seconds."""

from __future__ import annotations

from typing import Any

from dslide_workflows.bench import engine as engine_bench

COLUMNS = (
    ("contender", "contender", "{}"),
    ("train s", "train_seconds", "{:.1f}"),
    ("epochs", "epoch", "{:.3g}"),
    ("P@1", "P@1", "{:.4f}"),
    ("P@3", "P@3", "{:.4f}"),
    ("P@5", "P@5", "{:.4f}"),
    ("PSP@1", "PSP@1", "{:.4f}"),
    ("PSP@3", "PSP@3", "{:.4f}"),
    ("PSP@5", "PSP@5", "{:.4f}"),
    ("nDCG@5", "nDCG@5", "{:.4f}"),
    ("peak RSS MB", "peak_rss_mb", "{:,.0f}"),
)


def format_report(results: list[dict[str, Any]]) -> str:
    """The table (last epoch of each contender), each curve's P@1 by epoch, what the
    network adds (where its ablation ran), skipped ones."""
    ran = [r for r in results if "skipped" not in r]
    lines = [engine_bench.format_table(ran, COLUMNS)] if ran else []
    for r in ran:
        if r.get("curve"):
            points = "  ".join(_point(p) for p in r["curve"])
            per = "member" if "members" in r["curve"][0] else "epoch"
            lines.append(f"{r['contender']} P@1 by {per}: {points}")
    lines += _network_share(ran)
    lines += [f"{r['contender']}: skipped, {r['skipped']}" for r in results if "skipped" in r]
    return "\n".join(lines)


def _network_share(ran: list[dict[str, Any]]) -> list[str]:
    """What the network adds to the fused answer (``engine`` less ``engine-share0``), a
    line, where both ran."""
    by = {r["contender"]: r for r in ran}
    if "engine" not in by or "engine-share0" not in by:
        return []
    gain = {k: by["engine"][k] - by["engine-share0"][k] for k in ("P@1", "P@5", "PSP@5")}
    return [
        "the network's share (engine less engine-share0): "
        + ", ".join(f"{k} {v:+.4f}" for k, v in gain.items())
    ]


def _point(p: dict[str, Any]) -> str:
    """P@1 and seconds; "fitted" marks the model the fit returns: it has what the fit
    builds after its last step (held rows indexed, label trees), the epochs' points not."""
    return f"{p['P@1']:.4f} ({p['seconds']:.1f} s{', fitted' if p.get('fitted') else ''})"


def plot_p1(results: list[dict[str, Any]], title: str = "") -> bytes:
    """PNG of test P@1 against training wall-clock seconds: a curve per per-epoch
    contender, a point per label-tree library."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=100, layout="constrained")
    ax = fig.subplots()
    for r in results:
        if "skipped" in r:
            continue
        if r.get("curve"):
            xs, ys = zip(*((p["seconds"], p["P@1"]) for p in r["curve"]), strict=True)
            ax.plot(xs, ys, marker="o", label=r["contender"])
        else:
            ax.plot(
                r["train_seconds"],
                r["P@1"],
                marker="*",
                markersize=14,
                linestyle="",
                label=r["contender"],
            )
    ax.set(xlabel="training wall-clock seconds", ylabel="test P@1", title=title)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    out = io.BytesIO()
    FigureCanvasAgg(fig).print_png(out)
    return out.getvalue()

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

#: Contenders that take no seed: a repeat shows their own run-to-run spread.
SEEDLESS = ("omikuji",)
#: Contenders that are label trees: ours alone, and the libraries'.
TREES = ("engine-tree", "omikuji", "napkinxc", "pecos")


def format_report(results: list[dict[str, Any]]) -> str:
    """The table (last epoch of each contender; the mean of its runs when repeated), each
    curve's P@1 by epoch (by run when repeated), what the network adds (where its
    ablation ran), skipped ones."""
    ran = [r for r in results if "skipped" not in r]
    runs = _by_contender(ran)
    repeated = any(len(rs) > 1 for rs in runs.values())
    table = [_mean(rs) for rs in runs.values()] if repeated else ran
    lines = [engine_bench.format_table(table, COLUMNS)] if ran else []
    if repeated:
        lines.append(f"means of {max(len(rs) for rs in runs.values())} runs a contender")
        lines += [_by_run(name, rs) for name, rs in runs.items()]
    for r in [] if repeated else ran:
        if r.get("curve"):
            points = "  ".join(_point(p) for p in r["curve"])
            per = "member" if "members" in r["curve"][0] else "epoch"
            lines.append(f"{r['contender']} P@1 by {per}: {points}")
    lines += _network_share(runs)
    lines += _over_best_tree(runs)
    lines += [f"{r['contender']}: skipped, {r['skipped']}" for r in results if "skipped" in r]
    return "\n".join(lines)


def _by_contender(ran: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in ran:
        runs.setdefault(r["contender"], []).append(r)
    return runs


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A contender's row over its runs: each column's mean, the busiest run's CPU."""
    row: dict[str, Any] = {"contender": runs[0]["contender"]}
    for _, key, _ in COLUMNS[1:]:
        values = [r[key] for r in runs if r.get(key) is not None]
        row[key] = sum(values) / len(values) if values else None
    row["other_cpu_cores"] = max((r.get("other_cpu_cores") or 0.0) for r in runs)
    return row


def _by_run(name: str, runs: list[dict[str, Any]]) -> str:
    """A contender's P@1 in each run (its seed where it takes one) and their spread."""
    p1 = [r["P@1"] for r in runs]
    which = [f"run {r['run'] + 1}" if name in SEEDLESS else f"seed {r['seed']}" for r in runs]
    points = "  ".join(f"{r['P@1']:.4f} ({w})" for r, w in zip(runs, which, strict=True))
    return f"{name} P@1 by run: {points}  (spread {max(p1) - min(p1):.4f})"


def _network_share(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What the network adds to the fused answer (``engine`` less ``engine-share0``, run
    by run: the same seed), a line, where both ran."""
    if "engine" not in runs or "engine-share0" not in runs:
        return []
    pairs = list(zip(runs["engine"], runs["engine-share0"], strict=False))
    keys = ("P@1", "P@5", "PSP@5")
    gain = {k: [a[k] - b[k] for a, b in pairs] for k in keys}
    line = "the network's share (engine less engine-share0): " + ", ".join(
        f"{k} {sum(v) / len(v):+.4f}" for k, v in gain.items()
    )
    if len(pairs) > 1:
        line += f" (means; P@1 by run: {', '.join(f'{v:+.4f}' for v in gain['P@1'])})"
    return [line]


def _over_best_tree(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The fused answer's lead over the best label tree that ran (by mean P@1), and both
    contenders' seconds, a line: the lead a many-label set is judged by."""
    trees = [name for name in TREES if name in runs]
    if "engine" not in runs or not trees:
        return []
    mean = {n: _mean(runs[n]) for n in ("engine", *trees)}
    best = max(trees, key=lambda n: mean[n]["P@1"])
    ours, theirs = mean["engine"], mean[best]
    lead = ours["P@1"] - theirs["P@1"]
    return [
        f"the fused answer over the best tree ({best}): P@1 {lead:+.4f} "
        f"({lead / theirs['P@1']:+.1%}), in {ours['train_seconds']:.1f} s against "
        f"{theirs['train_seconds']:.1f} s"
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
        label = r["contender"] + (f" {r['run'] + 1}" if r.get("run") else "")
        if r.get("curve"):
            xs, ys = zip(*((p["seconds"], p["P@1"]) for p in r["curve"]), strict=True)
            ax.plot(xs, ys, marker="o", label=label)
        else:
            ax.plot(
                r["train_seconds"],
                r["P@1"],
                marker="*",
                markersize=14,
                linestyle="",
                label=label,
            )
    ax.set(xlabel="training wall-clock seconds", ylabel="test P@1", title=title)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    out = io.BytesIO()
    FigureCanvasAgg(fig).print_png(out)
    return out.getvalue()

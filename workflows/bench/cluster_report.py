"""The report of ``dslide bench cluster``: JSON, a Markdown table and a plot per run."""

from __future__ import annotations

import json
from pathlib import Path

from dslide_workflows.bench.host import BUSY_CORES


def write_report(out: Path, report: dict) -> None:
    """cluster.json, cluster.md (table) and cluster.png (plot) under ``out``; print the table."""
    (out / "cluster.json").write_text(json.dumps(report, indent=2, default=str))
    table = format_table(report)
    (out / "cluster.md").write_text(table + "\n")
    plot(report, out / "cluster.png")
    print()
    print(table)
    print(f"\nwritten: {out / 'cluster.md'}, {out / 'cluster.png'}, {out / 'cluster.json'}")


def _pairs(rows: list[dict]) -> list[tuple[int, str, dict | None, dict | None]]:
    """(nodes, link, dslide row, DDP row) in run order."""
    keys = list(dict.fromkeys((r["nodes"], r["link"]) for r in rows))
    by = {(r["nodes"], r["link"], r["contender"]): r for r in rows}
    return [
        (n, link, by.get((n, link, "dslide-dask")), by.get((n, link, "ddp"))) for n, link in keys
    ]


def format_table(report: dict) -> str:
    """One markdown table: both contenders per node count and link rate, and the ratios."""
    rows = report["rows"]
    base = {(r["nodes"], r["contender"]): r for r in rows[::-1]}  # first rate of each
    lines = [
        "| nodes | link | dslide s/step | DDP s/step | dslide epoch | DDP epoch | DDP/dslide "
        "| dslide bytes/step | DDP bytes/step | dslide/DDP bytes | dslide vs first link "
        "| P@1 dslide | P@1 DDP |",
        "|---" * 13 + "|",
    ]
    for n, link, s, d in _pairs(rows):
        first = base.get((n, "dslide-dask"))
        cells = [
            str(n),
            link,
            _get(s, "seconds_per_step", "{:.3f}"),
            _get(d, "seconds_per_step", "{:.2f}"),
            _duration(s),
            _duration(d),
            f"{d['seconds_per_step'] / s['seconds_per_step']:.0f}x" if s and d else "-",
            _bytes(s),
            _bytes(d),
            f"{100 * s['bytes_per_step'] / d['bytes_per_step']:.3f}%" if s and d else "-",
            f"{s['seconds_per_step'] / first['seconds_per_step']:.2f}x" if s and first else "-",
            _get(s, "P@1", "{:.4f}"),
            _get(d, "P@1", "{:.4f}"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    samples = next((r["samples"] for r in rows if "P@1" in r), None)
    lines.append("")
    lines.append(
        f"Epoch = s/step x {report['steps_per_epoch']:,} steps (one pass over "
        f"{report['data']['spec']['n_train']:,} rows at batch {report['args']['batch_size']}), "
        "extrapolated from the timed steps. Bytes: all nodes' sent bytes on their links "
        "(switch port counters) per step."
        + (
            f" P@1 on {report['data']['test_points']:,} test rows after {samples:,} samples, "
            "measured at the first link rate."
            if samples
            else ""
        )
    )
    busy = [r for r in rows if r.get("other_cpu_cores", 0.0) > BUSY_CORES]
    if busy:
        lines += ["", f"Timings inflated by other work on the machine (> {BUSY_CORES} cores):"]
    for r in busy:
        run = f"{r['contender']}, {r['nodes']} nodes, {r['link']}"
        lines.append(f"- other processes used {r['other_cpu_cores']:.1f} cores during {run}")
    return "\n".join(lines)


def _get(row: dict | None, key: str, fmt: str) -> str:
    return fmt.format(row[key]) if row and row.get(key) is not None else "-"


def _duration(row: dict | None) -> str:
    if not row:
        return "-"
    s = row["seconds_per_epoch"]
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _bytes(row: dict | None) -> str:
    if not row or row.get("bytes_per_step") is None:
        return "-"
    b = row["bytes_per_step"]
    return (
        f"{b / 1e3:.0f} KB" if b < 1e6 else f"{b / 1e6:.1f} MB" if b < 1e9 else f"{b / 1e9:.2f} GB"
    )


def plot(report: dict, path: Path) -> None:
    """Time per epoch and bytes per step against the link rate, one line a contender x nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for (contender, n), style in _series(rows):
        mine = {r["link"]: r for r in rows if r["contender"] == contender and r["nodes"] == n}
        xs = [i for i, link in enumerate(links) if link in mine]
        label = f"{contender}, {n} nodes"
        for ax, key, scale in (
            (axes[0], "seconds_per_epoch", 3600),
            (axes[1], "bytes_per_step", 1e6),
        ):
            ys = [mine[links[i]][key] / scale for i in xs]
            ax.plot(xs, ys, marker="o", label=label, **style)
    for ax, title in (
        (axes[0], "time per epoch (h, extrapolated)"),
        (axes[1], "bytes on the wire per step (MB)"),
    ):
        ax.set_yscale("log")
        ax.set_xticks(range(len(links)), links)
        ax.set_xlabel("link rate (each node)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{report['data']['preset']}: dslide-dask vs PyTorch DDP (gloo), emulated nodes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _series(rows: list[dict]) -> list[tuple[tuple[str, int], dict]]:
    """Line style of each (contender, nodes): colour by node count, dashed for DDP."""
    keys = list(dict.fromkeys((r["contender"], r["nodes"]) for r in rows))
    sizes = sorted({n for _, n in keys})
    return [
        (k, {"color": f"C{sizes.index(k[1])}", "ls": "-" if k[0] == "dslide-dask" else "--"})
        for k in keys
    ]

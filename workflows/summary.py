"""The summary of a training run, as printed and as numbers for the run folder."""

from __future__ import annotations

from typing import Any


def format_scores(scores: dict) -> str:
    """``P@1 0.1234  P@3 ...``: metric values as the CLI prints them."""
    return "  ".join(f"{k} {v:.4f}" for k, v in scores.items())


def summary(
    history,
    seconds,
    setup,
    shape,
    cfg,
    shards,
    scores,
    evaluations,
    recoveries=(),
    moves=(),
    *,
    test_rows: tuple[int, int] | None = None,
) -> tuple[str, dict]:
    """The run summary, as printed and as numbers: speed, traffic, sparsity, quality.

    ``test_rows``: the rows scored and the test set's rows: a score on a sample of the
    test file is not the file's, and the summary says which it is."""
    n_features, n_labels = shape
    samples = sum(h["samples"] for h in history)
    steps = len(history)
    numbers: dict[str, Any] = {
        "steps": steps,
        "last_step": history[-1]["step"] if history else None,
        "samples": samples,
        "samples_per_second": samples / max(seconds, 1e-9),
        "train_seconds": seconds,
        "setup_seconds": setup,
        "skipped_lines": history[-1].get("skipped_lines", 0) if history else 0,
        "active_per_example": sum(h["active"] for h in history) / max(1, steps),
        "n_features": n_features,
        "n_labels": n_labels,
        "evaluations": list(evaluations),
        "test": scores,
        "recoveries": [{**vars(r), "redone": r.redone} for r in recoveries],
        "moves": [vars(m) for m in moves],
    }
    if test_rows is not None:
        numbers.update(test_rows=test_rows[0], test_rows_total=test_rows[1])
    lines = ["run summary"]
    skipped = numbers["skipped_lines"]
    lines.append(
        f"  samples         {samples:,} in {steps:,} steps"
        + (f"; {skipped:,} bad lines skipped" if skipped else "")
    )
    lines.append(
        f"  samples/s       {numbers['samples_per_second']:,.0f} "
        f"(training {seconds:.1f} s, setup {setup:.1f} s)"
    )
    active = numbers["active_per_example"]
    lines.append(
        f"  active/example  {active:,.0f} of {n_labels:,} labels ({100 * active / n_labels:.2f}%)"
    )
    if shards:
        sizes = " / ".join(f"{s['neurons']:,}" for s in shards)
        busy = " / ".join(f"{1e3 * s['busy_seconds'] / max(1, steps):.0f}" for s in shards)
        lines.append(f"  shards          {len(shards)}: neurons {sizes}; busy ms/step {busy}")
        traffic = sum(h["bytes_sent"] + h["bytes_received"] for h in history) / max(1, steps)
        allreduce = cfg.allreduce_bytes(n_features, n_labels)
        numbers.update(shards=len(shards), bytes_per_step=traffic, allreduce_bytes=allreduce)
        lines.append(
            f"  bytes/step      {traffic / 1e3:,.0f} KB sent+received "
            f"({100 * traffic / allreduce:.3f}% of a {allreduce / 1e6:,.0f} MB "
            f"data-parallel all-reduce)"
        )
    for r in recoveries:
        lines.append(
            f"  recovered       lost {r.lost} at step {r.at_step}; back to step "
            f"{r.restored_step} on {r.workers} workers, {r.redone} steps redone "
            f"({r.seconds:.1f} s)"
        )
    for m in moves:
        why = ", ".join(
            f"{len(who)} {what}" for who, what in ((m.joined, "joined"), (m.leaving, "left")) if who
        )
        how = "worker to worker" if m.live else "through a checkpoint"
        prepared = (
            f"prepared over {m.steps_while_preparing} steps ({m.prepare_seconds:.1f} s), "
            if m.steps_while_preparing
            else ""
        )
        lines.append(
            f"  moved           at step {m.at_step} onto {m.workers} workers ({why}), "
            f"{how}: {m.rows_moved:,} rows ({m.bytes_moved / 1e6:,.0f} MB); "
            f"{prepared}training stopped {m.seconds:.2f} s"
        )
    for ev in evaluations:
        lines.append(
            f"  eval step {ev['step']:<5} "
            + format_scores({k: v for k, v in ev.items() if k != "step"})
        )
    if scores is not None:
        lines.append("  test            " + format_scores(scores) + _rows_scored(test_rows))
    return "\n".join(lines), numbers


def _rows_scored(test_rows: tuple[int, int] | None) -> str:
    """``  (2,000 of 12,830 rows; --eval-points to change)``, or ``  (all 12,830 rows)``."""
    if test_rows is None:
        return ""
    scored, total = test_rows
    if scored >= total:
        return f"  (all {total:,} rows)"
    return f"  ({scored:,} of {total:,} rows, spread over the file; --eval-points to change)"

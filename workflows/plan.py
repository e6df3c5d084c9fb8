"""``dslide plan``: what each worker would hold for a run, worked out without training.

Takes ``dslide train``'s flags. The cluster is the scheduler's (``--scheduler-address``)
or the LocalCluster ``dslide train`` would start (``--workers``, ``--threads-per-worker``,
each worker a share of this machine's memory, or ``--memory-limit``); the data's shape
comes from its header (or the preset's), and the fused parts' bytes from its first rows
(:data:`SAMPLE_ROWS`), so nothing is allocated. Exit status 1 when the model does not fit.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from dslide_dask.model.fused_size import NO_FUSED


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    from dslide_workflows.run_flags import add_run_arguments

    p = sub.add_parser(
        "plan",
        help="the memory each worker would hold for a run, without training",
        description="Print the bytes each worker would hold (weights, optimiser state, "
        "hash tables, buffers) for `dslide train` with the same flags, and whether that "
        "fits each worker's memory limit; exit status 1 if it does not.",
    )
    add_run_arguments(p)
    p.add_argument(
        "--memory-limit",
        metavar="BYTES",
        help="each LocalCluster worker's memory limit, e.g. 6GiB (default: "
        "this machine's memory shared by the workers)",
    )
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from dslide_dask import SlideConfig
    from dslide_dask.distributed.placement import place_shards
    from dslide_dask.errors import MemoryPlanError
    from dslide_dask.model.fused_build import FUSION_DEFAULTS, recipe_from
    from dslide_workflows.run_settings import resolve

    run, model = resolve(args)
    fusion = {k: model.pop(k) for k in list(model) if k in FUSION_DEFAULTS}
    cfg = SlideConfig.from_dict(model)
    n_features, n_labels = _shape(run)
    recipe = recipe_from(fusion)
    fused = recipe is not None
    cfg = cfg.for_data(n_labels, fused=fused)
    print(
        f"model: {n_features:,} features, hidden {cfg.hidden}, {n_labels:,} labels, "
        f"{cfg.parameters(n_features, n_labels):,} parameters"
    )
    workers, where = _workers(run, args.memory_limit)
    print(f"cluster: {where}")
    fused_bytes = NO_FUSED
    if recipe is not None:
        stats, how = _row_stats(run)
        fused_bytes = recipe.nbytes(stats, cfg.hidden[-1])
        trees = fused_bytes.trees / 2**30
        print(
            f"fused parts: {fused_bytes.last / 2**30:.2f} GiB at their build's peak, on the "
            f"last worker, and {trees:.2f} GiB of label trees in pieces over the workers "
            f"({how}; --opt neighbours=0: the network alone)"
        )
    try:
        placement = place_shards(
            workers,
            cfg,
            n_labels,
            run.n_shards,
            n_features=n_features,
            batch_size=run.batch_size,
            hidden_shards=run.hidden_shards,
            fused_bytes=fused_bytes,
        )
    except MemoryPlanError as err:
        print(err)
        return 1
    assert placement.plan is not None  # place_shards always returns its plan
    print(placement.plan.table())
    print("fits: every worker stays under 80% of its memory limit")
    return 0


#: Rows of the training file read to estimate the fused parts' bytes.
SAMPLE_ROWS = 20_000


def _row_stats(run):
    """The training rows' statistics for the fused parts' bytes (``RowStats``), from the
    first rows of the training file scaled to all of them (or the preset's averages), and
    how they were had."""
    from dslide_dask.model.fused_size import RowStats, block_counts
    from dslide_dask.model.label_tree import mostly_rare_counts

    if run.preset:
        from dslide_dask.data.synthetic import resolve_spec

        spec = resolve_spec(run.preset)
        f, y = round(spec.n_train * spec.avg_nnz), round(spec.n_train * spec.avg_labels)
        stats = RowStats(
            spec.n_train, spec.n_features, spec.n_labels, f, y, round(y * spec.avg_nnz)
        )
        return stats, "from the preset's averages"
    from dslide_dask.data.batches import plan
    from dslide_dask.data.blocks import stack_datasets
    from dslide_dask.data.source import read_partition

    source = plan(run.train, run.storage_options)
    blocks, rows = [], 0
    for part in source.partitions:
        data, _ = read_partition(part, run.skip_bad_lines)
        blocks.append(data)
        rows += data.n_points
        if rows >= SAMPLE_ROWS:
            break
    data = stack_datasets(blocks, source.n_features, source.n_labels)
    counts, *rest = block_counts(data)
    stats = RowStats.of_counts(source.n_features, counts, *rest)
    how = f"estimated from the first {data.n_points:,} rows"
    if data.n_points < source.n_points:  # a label's rows, and so its rarity, scale too
        rare = mostly_rare_counts(counts * (source.n_points / data.n_points))
        stats = replace(stats.scaled(source.n_points), mostly_rare=rare)
    return stats, how


def _shape(run) -> tuple[int, int]:
    if run.preset:
        from dslide_dask.data.synthetic import resolve_spec

        spec = resolve_spec(run.preset)
        return spec.n_features, spec.n_labels
    from dslide_dask.data.batches import plan, shape

    return shape(plan(run.train, run.storage_options))


def _workers(run, memory_limit: str | None) -> tuple[dict[str, dict], str]:
    """The scheduler's workers, or those of the LocalCluster ``dslide train`` would start."""
    from dask.utils import parse_bytes
    from distributed.system import MEMORY_LIMIT

    if run.in_process:
        raise ValueError("dslide plan is for a Dask cluster: drop --in-process")
    if run.scheduler_address:
        from dslide_workflows.security import client_security, connect_client

        security = client_security(run, run.scheduler_address)
        with connect_client(run.scheduler_address, security, run.connect_timeout) as client:
            workers = client.scheduler_info(n_workers=-1)["workers"]
        return workers, f"{run.scheduler_address}, {len(workers)} workers"
    n = run.workers or os.cpu_count() or 1
    limit = parse_bytes(memory_limit) if memory_limit else MEMORY_LIMIT // n
    if limit <= 0:
        raise ValueError(f"--memory-limit must be positive, got {memory_limit!r}")
    workers = {
        f"local-worker-{i}": {"nthreads": run.threads_per_worker, "memory_limit": limit}
        for i in range(n)
    }
    return workers, (
        f"LocalCluster of {n} worker(s) x {run.threads_per_worker} thread(s), "
        f"{limit / 2**30:.2f} GiB each"
    )

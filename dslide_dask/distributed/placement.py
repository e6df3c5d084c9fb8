"""Where shards go: one per worker, sized by the worker's threads and memory, with a plan of
the bytes each worker will hold made before anything is allocated."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dslide_dask.distributed.memory_plan import (
    BUDGET,
    MemoryPlan,
    hidden_memory,
    memory_plan,
    what_would_fit,
)
from dslide_dask.errors import MemoryPlanError
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.fused_size import NO_FUSED, FusedBytes
from dslide_dask.model.hidden import unit_ranges
from dslide_dask.model.layout import ShardLayout


@dataclass(frozen=True)
class Placement:
    """Worker address of each shard (shard 0 also hosts the coordinator) and the layout."""

    workers: tuple[str, ...]
    layout: ShardLayout
    plan: MemoryPlan | None = None
    #: the hidden layer's units on each of the first shards' workers (empty: all on the
    #: coordinator's)
    hidden_units: tuple[tuple[int, int], ...] = ()


def shard_bytes(cfg: SlideConfig, n_neurons: int) -> int:
    """Memory of a shard of ``n_neurons``: weights, optimiser state, tables, buffers."""
    from dslide_dask.distributed.memory_plan import shard_memory

    return sum(shard_memory(cfg, n_neurons).values())


def place_shards(
    workers: dict[str, dict],
    cfg: SlideConfig,
    n_labels: int,
    n_shards: int | None = None,
    *,
    coordinator_load: float = 0.15,
    n_features: int = 0,
    batch_size: int = 256,
    previous: Placement | None = None,
    hidden_shards: int | None = None,
    fused_bytes: FusedBytes = NO_FUSED,
    answering: bool = False,
) -> Placement:
    """Choose workers for the shards of an output layer of ``n_labels`` neurons.

    ``workers`` is the scheduler's view (``Client.scheduler_info()["workers"]``). By
    default every worker gets one shard, with a share of the neurons proportional to its
    threads; ``n_shards`` takes the workers with the most threads first. The first worker
    also runs the coordinator (the hidden layers, ``n_features`` wide), whose work is
    taken as ``coordinator_load`` of that worker's capacity, so its shard is that much
    smaller. When shares by threads would put more on a worker than 80% of its memory
    limit, the shares follow the workers' free memory instead; when nothing fits,
    :class:`MemoryPlanError` says what each worker would hold and what would fit.

    ``previous``: the placement of a model being re-balanced live. Its workers that are
    still there keep their order (the coordinator stays where it is, if it can) and the
    layout moves as few neurons as the new shares allow (:meth:`ShardLayout.rebalanced`).

    ``hidden_shards``: the workers the (one-layer) hidden stack's units are split over,
    the first ones. None decides by bytes: the stack stays whole on the coordinator's
    worker unless it would fill more than :data:`HIDDEN_SHARE` of that worker's budget
    or the model would not fit so; then it is split over every shard's worker.

    ``fused_bytes``: what the fused parts (built on the last worker after training, their
    label trees in pieces over every worker) will take at the build's peak; a worker's
    share is smaller by its part of them.

    ``answering``: a model loaded to answer only (``SlideClassifier.load(...,
    answering=True)``), planned without the optimiser state it does not hold.
    """
    if not 0 <= coordinator_load < 1:
        raise ValueError(f"coordinator_load must be in [0, 1), got {coordinator_load}")
    if not workers:
        raise ValueError("the Dask cluster has no workers")
    order = sorted(workers, key=lambda a: (-workers[a].get("nthreads", 1), a))
    if previous is not None:
        kept = [a for a in previous.workers if a in workers]
        order = kept + [a for a in order if a not in kept]
    n_shards = len(order) if n_shards is None else n_shards
    if not 1 <= n_shards <= len(order):
        raise ValueError(f"n_shards must be in [1, {len(order)}] (the workers), got {n_shards}")
    chosen = {a: workers[a] for a in order[:n_shards]}
    infos = list(chosen.values())
    limited = all(w.get("memory_limit") for w in infos)
    if hidden_shards is not None:
        if hidden_shards > 1 and len(cfg.hidden) != 1:
            raise ValueError(
                f"hidden_shards={hidden_shards}: only a one-layer hidden stack splits by "
                f"units, got hidden={list(cfg.hidden)}"
            )
        splits = [min(hidden_shards, n_shards)]
    elif not (limited and len(cfg.hidden) == 1 and n_shards > 1):
        splits = [1]
    elif _hidden_crowds(cfg, n_features, infos[0], answering):
        splits = [n_shards]
    else:
        splits = [1, n_shards]  # split only if the model does not fit whole
    index = {a: s for s, a in enumerate(chosen)}
    plan = None
    for split in splits:
        units = tuple(unit_ranges(cfg.hidden[0], split)) if split > 1 else ()
        shares = _candidates(
            cfg, n_features, infos, units, coordinator_load=coordinator_load,
            n_labels=n_labels, fused=fused_bytes, answering=answering,
        )  # fmt: skip
        for capacities in shares:
            if previous is None:
                layout = ShardLayout.from_capacities(n_labels, capacities)
            else:
                new_index = [index.get(a) for a in previous.workers]
                layout = previous.layout.rebalanced(capacities, new_index)
            sizes = [layout.size(s) for s in range(n_shards)]
            plan = memory_plan(
                cfg, n_features, chosen, sizes, batch_size=batch_size, hidden_units=units,
                fused=fused_bytes, answering=answering,
            )  # fmt: skip
            if plan.fits:
                return Placement(tuple(chosen), layout, plan, units)
    assert plan is not None, "no split and share was tried"  # splits and shares are never empty
    ideas = what_would_fit(cfg, plan, len(workers))
    raise MemoryPlanError(
        f"the model does not fit {n_shards} worker(s): it needs {plan.total / 2**30:.2f} GiB "
        f"and each worker may fill 80% of its memory limit.\n{plan.table()}"
        + (f"\nIt would fit with: {'; or '.join(ideas)}." if ideas else "")
    )


#: Share of the coordinator's worker's budget the whole hidden stack may take before the
#: placement splits it by units over the shards' workers.
HIDDEN_SHARE = 0.5


def _hidden_crowds(cfg: SlideConfig, n_features: int, info: dict, answering: bool) -> bool:
    """Whether the whole hidden stack would take more than :data:`HIDDEN_SHARE` of the
    coordinator's worker's budget."""
    held = sum(hidden_memory(cfg, n_features, answering=answering).values())
    return held > HIDDEN_SHARE * BUDGET * info["memory_limit"]


def _candidates(
    cfg: SlideConfig,
    n_features: int,
    infos: list[dict],
    units: tuple,
    *,
    coordinator_load: float,
    n_labels: int,
    fused: FusedBytes = NO_FUSED,
    answering: bool = False,
) -> list[list[int]]:
    """Shares to try: by threads, then (with memory limits) by free memory, each worker's
    part of the hidden stack and its process taken off."""
    by_threads = [max(1, int(w.get("nthreads", 1))) for w in infos]
    out = [_capacities(by_threads, coordinator_load, n_labels)]
    if all(w.get("memory_limit") for w in infos):
        empty = memory_plan(
            cfg,
            n_features,
            {str(s): w for s, w in enumerate(infos)},
            [0] * len(infos),
            hidden_units=units,
            fused=fused,
            answering=answering,
        )
        held = [e.total for e in empty.workers]  # the hidden stack's part, the process
        free = [BUDGET * w["memory_limit"] - h for w, h in zip(infos, held, strict=True)]
        percent = [max(1, round(100 * f / max(free))) for f in free]  # of the freest
        out.append(_capacities(percent, 0.0, n_labels))
    return out


def _capacities(weights: list[int], coordinator_load: float, n_labels: int) -> list[int]:
    """Integer shares in proportion to ``weights``, less ``coordinator_load`` of the first
    (in percent steps, coarser when the layer has fewer neurons than the pattern)."""
    for grain in (100, 10, 1):
        caps = [grain * w for w in weights]
        if len(caps) > 1:
            caps[0] = max(1, round(caps[0] * (1 - coordinator_load)))
        divisor = math.gcd(*caps)
        caps = [c // divisor for c in caps]
        if sum(caps) <= n_labels:
            return caps
    return caps

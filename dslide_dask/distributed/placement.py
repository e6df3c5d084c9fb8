"""Where shards go: one per worker, sized by the worker's threads, checked against memory."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dslide_dask.model.config import SlideConfig
from dslide_dask.model.layout import ShardLayout


@dataclass(frozen=True)
class Placement:
    """Worker address of each shard (shard 0 also hosts the coordinator) and the layout."""

    workers: tuple[str, ...]
    layout: ShardLayout


def shard_bytes(cfg: SlideConfig, n_neurons: int) -> int:
    """Memory of a shard of ``n_neurons``: weights, Adam moments, bias, hash tables."""
    per_neuron = 4 * (3 * cfg.hidden[-1] + 3)
    tables = 4 * cfg.L * (1 << cfg.buckets_pow(n_neurons)) * (cfg.bucket_capacity + 1)
    return per_neuron * n_neurons + tables


def place_shards(
    workers: dict[str, dict],
    cfg: SlideConfig,
    n_labels: int,
    n_shards: int | None = None,
    *,
    coordinator_load: float = 0.15,
) -> Placement:
    """Choose workers for the shards of an output layer of ``n_labels`` neurons.

    ``workers`` is the scheduler's view (``Client.scheduler_info()["workers"]``). By
    default every worker gets one shard, with a share of the neurons proportional to its
    threads; ``n_shards`` takes the workers with the most threads first. The first worker
    also runs the coordinator (the hidden layers), whose work is taken as
    ``coordinator_load`` of that worker's capacity, so its shard is that much smaller.
    """
    if not 0 <= coordinator_load < 1:
        raise ValueError(f"coordinator_load must be in [0, 1), got {coordinator_load}")
    if not workers:
        raise ValueError("the Dask cluster has no workers")
    order = sorted(workers, key=lambda a: (-workers[a].get("nthreads", 1), a))
    n_shards = len(order) if n_shards is None else n_shards
    if not 1 <= n_shards <= len(order):
        raise ValueError(f"n_shards must be in [1, {len(order)}] (the workers), got {n_shards}")
    chosen = tuple(order[:n_shards])
    layout = ShardLayout.from_capacities(
        n_labels, _capacities([workers[a] for a in chosen], coordinator_load, n_labels)
    )
    for s, address in enumerate(chosen):
        need = shard_bytes(cfg, layout.size(s))
        limit = workers[address].get("memory_limit") or 0
        if limit and need > 0.8 * limit:
            raise ValueError(
                f"shard {s} needs ~{need / 2**30:.2f} GiB but worker {address} has "
                f"{limit / 2**30:.2f} GiB: add workers, or lower range_pow/L/bucket_capacity"
            )
    return Placement(chosen, layout)


def _capacities(workers: list[dict], coordinator_load: float, n_labels: int) -> list[int]:
    """Integer shares per worker: threads, less ``coordinator_load`` of the first worker's
    (in percent steps, coarser when the layer has fewer neurons than the pattern)."""
    for grain in (100, 10, 1):
        caps = [grain * max(1, int(w.get("nthreads", 1))) for w in workers]
        if len(caps) > 1:
            caps[0] = max(1, round(caps[0] * (1 - coordinator_load)))
        divisor = math.gcd(*caps)
        caps = [c // divisor for c in caps]
        if sum(caps) <= n_labels:
            return caps
    return caps

"""What each worker will hold, worked out before anything is allocated.

A shard of ``n`` output neurons of width ``d`` holds its weights and bias (``4 n (d+1)``
bytes), Adam's second moment (as much again, half with ``moment_dtype="bfloat16"``) and
first moment (the same, only with ``beta1 > 0``: its pages are never touched
otherwise), ``L`` hash tables, and per-step
buffers of about ``batch_size x max_active`` entries. The coordinator's worker also
holds the hidden layers with their Adam state. Every worker process itself (Python,
numba's compiled kernels, Dask) takes :data:`RUNTIME_BYTES`: measured on the 0.8B-parameter
``amazon-3m`` run, whose four workers peaked at 11.4 GB for 8.4 GB of arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from dslide_dask.model.config import SlideConfig
from dslide_dask.model.fused_size import NO_FUSED, FusedBytes

#: A worker process's own memory (interpreter, numba kernels, Dask), measured.
RUNTIME_BYTES = 600 * 2**20
#: Share of a worker's memory limit a plan may fill (Dask pauses a worker at 80%).
BUDGET = 0.8
#: Bytes of one Adam moment entry, by ``SlideConfig.moment_dtype``.
MOMENT_BYTES = {"float32": 4, "bfloat16": 2}
#: Bytes per entry of the per-step buffers (logits, gradients, ids, twice for the pipeline).
BUFFER_BYTES_PER_ENTRY = 32


def fits(need: float, limit: int) -> bool:
    """Whether ``need`` bytes stay within a worker's memory ``limit`` (0: none) as Dask
    lets them: below :data:`BUDGET` of it, where it pauses the worker."""
    return not limit or need <= BUDGET * limit


@dataclass(frozen=True)
class WorkerMemory:
    """Bytes one worker will hold for the model."""

    address: str
    role: str
    neurons: int
    weights: int
    optimizer: int
    tables: int
    buffers: int  #: per-step buffers and the process itself
    limit: int  #: the worker's memory limit (0: none)
    #: the fused parts (neighbours, centroids, trees) built there after training, at the
    #: build's peak (:func:`~dslide_dask.model.fused_size.fused_bytes`)
    fused: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.tables + self.buffers + self.fused

    @property
    def fits(self) -> bool:
        return fits(self.total, self.limit)


@dataclass(frozen=True)
class MemoryPlan:
    workers: tuple[WorkerMemory, ...]

    @property
    def fits(self) -> bool:
        return all(w.fits for w in self.workers)

    @property
    def total(self) -> int:
        return sum(w.total for w in self.workers)

    def table(self) -> str:
        """The plan as a table, in GiB."""
        head = f"{'worker':<28}{'holds':<22}{'neurons':>11}{'weights':>9}{'optim':>8}"
        head += f"{'tables':>8}{'buffers':>9}{'fused':>8}{'total':>8}{'limit':>8}"
        rows = [head + "  (GiB)"]
        for w in self.workers:
            limit = f"{_gib(w.limit):>8}" if w.limit else f"{'-':>8}"
            mark = "" if w.fits else "  over 80% of its limit"
            rows.append(
                f"{w.address[-27:]:<28}{w.role:<22}{w.neurons:>11,}{_gib(w.weights):>9}"
                f"{_gib(w.optimizer):>8}{_gib(w.tables):>8}{_gib(w.buffers):>9}"
                f"{_gib(w.fused):>8}{_gib(w.total):>8}{limit}{mark}"
            )
        pad = f"{'':>11}{'':>9}{'':>8}{'':>8}{'':>9}{'':>8}"
        rows.append(f"{'all workers':<50}{pad}{_gib(self.total):>8}")
        return "\n".join(rows)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def shard_memory(
    cfg: SlideConfig, n_neurons: int, batch_size: int = 256, *, answering: bool = False
) -> dict[str, int]:
    """Weights, optimiser state, tables and per-step buffers of a shard of ``n_neurons``
    (``answering``: a model loaded to answer only has no optimiser state)."""
    row = 4 * n_neurons * (cfg.hidden[-1] + 1)
    moments = (2 if cfg.beta1 > 0 else 1) * n_neurons * (
        MOMENT_BYTES[cfg.moment_dtype] * cfg.hidden[-1] + 4  # + the bias's, float32
    ) + 4 * n_neurons  # each row's update count
    tables = 4 * cfg.L * (1 << cfg.buckets_pow(max(1, n_neurons))) * (cfg.bucket_capacity + 1)
    buffers = BUFFER_BYTES_PER_ENTRY * batch_size * cfg.max_active
    optimizer = 0 if answering else moments
    return {"weights": row, "optimizer": optimizer, "tables": tables, "buffers": buffers}


def row_bytes(cfg: SlideConfig) -> int:
    """Bytes of one output row's weights and optimiser state (what a move carries)."""
    parts = shard_memory(cfg, 1)
    return parts["weights"] + parts["optimizer"]


def hidden_memory(
    cfg: SlideConfig, n_features: int, units: int | None = None, *, answering: bool = False
) -> dict[str, int]:
    """The hidden layers' weights and optimiser state (on the coordinator's worker; none
    when ``answering``), or those of ``units`` units of a one-layer stack split by units."""
    widths = (n_features, *cfg.hidden) if units is None else (n_features, units)
    params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    first = n_features * widths[1]  # the sparse input layer's moments: moment_dtype
    per_moment = MOMENT_BYTES[cfg.moment_dtype] * first + 4 * (params - first)
    counts = 4 * n_features  # each input row's update count
    optimizer = 0 if answering else (2 if cfg.beta1 > 0 else 1) * per_moment + counts
    return {"weights": 4 * params, "optimizer": optimizer}


def memory_plan(
    cfg: SlideConfig,
    n_features: int,
    placement_workers: dict[str, dict],
    sizes: list[int],
    *,
    batch_size: int = 256,
    hidden_units: tuple[tuple[int, int], ...] = (),
    fused: FusedBytes = NO_FUSED,
    answering: bool = False,
) -> MemoryPlan:
    """The plan of shards of ``sizes`` neurons on ``placement_workers`` (address ->
    the scheduler's worker info, in shard order); shard 0's worker also holds the
    hidden layers, or, split by units, shard s's worker units ``hidden_units[s]``; the
    last worker builds and holds the ``fused`` parts (their trees in pieces over all).
    ``answering``: a model loaded to answer only, without optimiser state."""
    held = [hidden_memory(cfg, n_features, answering=answering)]
    if hidden_units:
        held = [hidden_memory(cfg, n_features, b - a, answering=answering) for a, b in hidden_units]
    out = []
    for s, (address, info) in enumerate(placement_workers.items()):
        parts = shard_memory(cfg, sizes[s], batch_size, answering=answering)
        weights, optimizer = parts["weights"], parts["optimizer"]
        role = f"shard {s}"
        if s < len(held):
            weights += held[s]["weights"]
            optimizer += held[s]["optimizer"]
            role = "hidden layers, shard 0" if not hidden_units else f"hidden units, shard {s}"
        out.append(
            WorkerMemory(
                address,
                role,
                sizes[s],
                weights,
                optimizer,
                parts["tables"],
                parts["buffers"] + RUNTIME_BYTES,
                int(info.get("memory_limit") or 0),
                fused.on(s, len(sizes)),
            )
        )
    return MemoryPlan(tuple(out))


def what_would_fit(cfg: SlideConfig, plan: MemoryPlan, n_workers_total: int) -> list[str]:
    """Changes that would make ``plan`` fit, each with the size it would give; a change
    that would not be enough on its own says so."""
    over = [w for w in plan.workers if not w.fits]
    need = sum(w.total for w in plan.workers)
    room = [BUDGET * w.limit for w in plan.workers if w.limit]
    ideas = []
    if room:
        per_worker = sum(room) / len(room)
        workers = -(-need // max(1.0, per_worker - RUNTIME_BYTES))
        if workers > n_workers_total:
            ideas.append(
                f"{int(workers)} or more workers like these ({_gib(per_worker / BUDGET)} GiB)"
            )

    def shrink(change: str, saving) -> None:
        enough = all(fits(w.total - saving(w), w.limit) for w in plan.workers)
        total = need - sum(saving(w) for w in plan.workers)
        ideas.append(f"{change}: {_gib(total)} GiB in all{'' if enough else ', not enough alone'}")

    if cfg.beta1 > 0:
        shrink("beta1=0 (no first Adam moment)", lambda w: w.optimizer / 2)
    if cfg.moment_dtype == "float32":
        shrink('moment_dtype="bfloat16" (half-size Adam state)', lambda w: w.optimizer / 2)
    tables = sum(w.tables for w in plan.workers)
    if tables > 0.1 * need and cfg.L > 1:
        shrink(f"L={cfg.L // 2} hash tables", lambda w: w.tables / 2)
    fused = max((w.fused for w in over), default=0)
    if fused:
        ideas.append(
            f"neighbours=0 (the network alone, without the {_gib(fused)} GiB of neighbours, "
            "label centroids and trees a worker would hold)"
        )
    if over and plan.workers[0] in over and len(plan.workers) > 1:
        if len(cfg.hidden) == 1 and plan.workers[0].role.startswith("hidden layers"):
            ideas.append(f"hidden_shards={len(plan.workers)} (the hidden layer split by units)")
        ideas.append("a larger first worker: it also holds the hidden layers")
    return ideas


def fits_while_moving(old: MemoryPlan, new: MemoryPlan, copied: int | None = None) -> bool:
    """Whether every worker can hold, at once, its part of the old model, its part of the
    new one and copies of the old rows it hands on, as a live re-balance needs: at worst
    every old row copied out before the old part is released, or (rows streamed) at most
    ``copied`` bytes of them at a time."""
    limits = {w.address: w.limit for w in (*old.workers, *new.workers)}
    peak = dict.fromkeys(limits, 0)
    for w in old.workers:
        peak[w.address] += w.total + (w.weights + w.optimizer if copied is None else copied)
    had = {w.address for w in old.workers}
    for w in new.workers:  # a worker's own process counted once
        peak[w.address] += w.total - (RUNTIME_BYTES if w.address in had else 0)
    return all(fits(p, limits[a]) for a, p in peak.items())

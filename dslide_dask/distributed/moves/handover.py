"""A live model handed to a new set of workers, worker to worker.

A re-balance (workers joined, or one must leave) builds the new model's actors while the
old ones are still up. The output rows of a :attr:`Handover.mirrored` handover are
streamed to them by the old shards (:mod:`.mirroring`); otherwise, for each new shard, a
task on the worker of every old shard that holds some of its rows copies them out
(weights, optimiser state, update counts), and the new actor is submitted with those
tasks' results as arguments, so Dask carries them from worker to worker: nothing goes
through the client or storage. Rows whose worker does not change are copied straight
from the old shard to the new one in that process. The new shard takes the rows into its
own order and rehashes them into its own tables. The hidden layer goes the same way,
whole from the coordinator or as units from the workers that hold them (re-split over
the new holders), and so do the coordinator's step and label counts.

The old model may train on meanwhile (:mod:`.rebalance`): the copies are then a few steps
old, and :meth:`HandoverPieces.settle` copies them again, at a step boundary (no step in
flight, nothing changing), into the standing actors, which keep their tables. The old
actors are released once the new ones have taken over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dslide_dask.distributed.placement import Placement
from dslide_dask.distributed.registry import COORDINATOR, lookup
from dslide_dask.metrics import TrainingLabels
from dslide_dask.model.hidden import HiddenLayers, gather_units
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.wide_shard import WideShard

#: Dask priority of the copying tasks: before the new actors' constructors.
PRIORITY = 100


@dataclass(frozen=True)
class Handover:
    """Where a new model's parts find the old model's: its id in each worker's registry
    (:mod:`~dslide_dask.distributed.registry`) and its layout."""

    model_id: str
    layout: ShardLayout
    workers: tuple[str, ...]  #: the worker of each old shard (shard 0: the coordinator's)
    hidden_units: tuple[tuple[int, int], ...] = ()  #: the old split of the hidden layer
    #: the old shards stream the rows (:mod:`.mirroring`): no rows are copied here
    mirrored: bool = False


@dataclass
class RowsPiece:
    """Rows of one old shard bound for one new shard, in the new shard's order."""

    arrays: dict[str, np.ndarray]  #: named as :attr:`WideShard.ROW_ARRAYS`
    counters: dict[str, int]  #: the old shard's step and table schedule


@dataclass(frozen=True)
class LocalRows:
    """Rows of an old shard in the new shard's own worker process: copied straight
    from it, row by row (no copy in between, nothing serialised)."""

    model_id: str  #: the old model's


@dataclass
class UnitsPiece:
    """Hidden units ``a .. b-1`` of one old holder (the whole stack when ``a`` is None)."""

    a: int | None
    b: int | None
    arrays: dict[str, np.ndarray]  #: named as :meth:`HiddenLayers.state`
    step: int  #: the stack's Adam step


@dataclass
class CoordinatorState:
    """What a coordinator hands its successor besides the model's arrays."""

    step: int
    last_checkpoint: str | None
    labels: TrainingLabels  #: PSP@k's label counts so far
    #: the planned data source and the rest of the stream (None: no data set yet)
    data: tuple | None = None


def rows_for(model_id: str, old_shard: int, new_layout: ShardLayout, new_shard: int) -> RowsPiece:
    """Task on an old shard's worker: copies of its rows that ``new_shard`` will own."""
    shard: WideShard = lookup(model_id, old_shard).shard
    for j, _, there in new_layout.sources(new_shard, shard.layout):
        if j == old_shard:
            return RowsPiece(shard.rows(there), shard.state()[1])
    raise ValueError(f"old shard {old_shard} holds no rows of new shard {new_shard}")


def take_rows(
    shard: WideShard,
    old: ShardLayout,
    pieces: Mapping[int, RowsPiece | LocalRows],
    rehash: bool = True,
    *,
    some: bool = False,
) -> None:
    """Fill a new shard from the pieces of the old shards holding its rows, then rehash
    it (``rehash=False``: its tables stay, unless the old shards redrew their hash
    functions since). ``some``: pieces of some of those shards only."""
    sources = shard.layout.sources(shard.shard_index, old)
    if not some and sorted(pieces) != [j for j, _, _ in sources]:
        raise ValueError(f"rows from shards {sorted(pieces)}, expected {[j for j, *_ in sources]}")
    for j, here, there in sources:
        if (piece := pieces.get(j)) is None:
            continue
        if isinstance(piece, LocalRows):
            donor: WideShard = lookup(piece.model_id, j).shard
            shard.copy_rows(here, donor, there)
            counters = donor.state()[1]
        else:
            shard.put_rows(here, piece.arrays)
            counters = piece.counters
    shard.set_counters(counters, rehash=rehash)


def settle(model_id: str, part: int | str, old: ShardLayout, piece) -> None:
    """Task on a new part's worker when a prepared move switches: one piece of the old
    model, as it is now, into the actor built from an earlier copy of it (rows from one
    old shard, ``{j: piece}``; a hidden layer's units; the coordinator's counters). Each
    piece goes as soon as it is copied out, so the pieces cross the network side by side
    with the copying of the others."""
    lookup(model_id, part).settle(old, piece)


def coordinator_state(model_id: str) -> CoordinatorState:
    """Task on the old coordinator's worker: its counters."""
    old = lookup(model_id, COORDINATOR)
    return CoordinatorState(old.step, old.last_checkpoint, old.labels, old.data_left())


def units_for(model_id: str, part: int | str, a: int | None, b: int | None) -> UnitsPiece:
    """Task on an old holder's worker (a shard, or the coordinator with the whole stack):
    its hidden units ``a .. b-1`` (None: all of the stack, shared, not copied: the
    successor copies them into its own)."""
    hidden: HiddenLayers = lookup(model_id, part).hidden
    state = hidden.state()
    if a is None:
        return UnitsPiece(None, None, state, hidden.step)
    assert b is not None, "units a .. b-1 with a but no b"
    first = hidden.columns[0] if hidden.columns else 0
    arrays = {k: v if k == "W0.n" else v[..., a - first : b - first] for k, v in state.items()}
    return UnitsPiece(a, b, arrays, hidden.step)


def take_units(hidden: HiddenLayers, pieces: list[UnitsPiece], *, adopt: bool = False) -> None:
    """Fill a new hidden stack (or slice) from the old holders' pieces (``adopt``: a whole
    stack's arrays become the new one's, uncopied; for a switch, after which the old
    stack is never used again)."""
    if len(pieces) == 1 and pieces[0].a is None:
        take = hidden.adopt if adopt else hidden.set_state
        take(pieces[0].arrays, pieces[0].step)
        return
    columns = hidden.columns or (0, hidden.cfg.hidden[0])
    sources = [(p.a, p.b, p.arrays.get) for p in pieces]
    hidden.set_state(gather_units(hidden.state(), columns, sources), pieces[0].step)


class HandoverPieces:
    """The tasks that copy a live model's parts out for the new actors, as the extra
    constructor arguments of each (none without a handover). Each task is pinned to
    the old part's worker; Dask moves its result to the new actor's. All are submitted
    at once, before anything that takes them (a one-thread worker building a new shard
    or taking its rows would otherwise hold back the rows other new shards wait for)."""

    def __init__(self, client, handover: Handover | None, new: Placement, token: str) -> None:
        self.client, self.handover, self.token = client, handover, token
        self.layout, self.workers = new.layout, new.workers
        self.hidden_units = new.hidden_units  #: the new split of the hidden layer
        self._args: list[tuple] = []
        if handover is not None:
            shards = [self._shard(handover, s) for s in range(1, len(self.workers))]
            self._args = [self._coordinator(handover), *shards]

    def shard(self, s: int) -> tuple:
        """``(rows,)`` or, for a holder of hidden units, ``(rows, units)``: new shard
        ``s``'s rows by old shard, and its units' pieces."""
        return self._args[s] if self._args else ()

    def coordinator(self) -> tuple:
        """``(state, rows, units)`` for the new coordinator (which holds shard 0): the
        units of the whole stack, or of shard 0's slice."""
        return self._args[0] if self._args else ()

    def settle(self, model_id: str) -> list:
        """Tasks that copy the old model's parts, as they are now, into the standing
        actors of model ``model_id``, a task a piece: the switch of a prepared move."""
        old = self.handover
        if old is None:  # nothing was copied out
            return []
        tasks = []
        for s, args in enumerate(self._args):
            part = COORDINATOR if s == 0 else s
            rows = args[1] if s == 0 else args[0]
            pieces = [{j: piece} for j, piece in rows.items()]
            pieces += [args[0]] if s == 0 else []  # the coordinator's counters
            pieces += [args[-1]] if s == 0 or len(args) > 1 else []  # hidden units
            tasks += [
                self._on(
                    self.workers[s],
                    f"handover-settle-{s}-{i}",
                    settle,
                    model_id,
                    part,
                    old.layout,
                    piece,
                    priority=0,
                )
                for i, piece in enumerate(pieces)
            ]
        return tasks

    def _shard(self, old: Handover, s: int) -> tuple:
        if s < len(self.hidden_units):
            return (*self._rows(old, s), self._units(old, self.hidden_units[s]))
        return self._rows(old, s)

    def _coordinator(self, old: Handover) -> tuple:
        state = self._on(old.workers[0], "handover-coordinator", coordinator_state, old.model_id)
        units = self._units(old, self.hidden_units[0] if self.hidden_units else None)
        return (state, *self._rows(old, 0), units)

    def _units(self, old: Handover, units: tuple[int, int] | None) -> list:
        """Tasks copying units ``units`` (None: the whole stack) out of the old holders."""
        if not old.hidden_units:  # the whole stack on the old coordinator
            sources = [(COORDINATOR, 0, *(units or (None, None)))]
        else:
            lo, hi = units or (0, old.hidden_units[-1][1])
            sources = [
                (j, j, max(a, lo), min(b, hi))
                for j, (a, b) in enumerate(old.hidden_units)
                if a < hi and b > lo
            ]
        return [
            self._on(
                old.workers[j],
                f"handover-units-{part}-{a}-{b}",
                units_for,
                old.model_id,
                part,
                a,
                b,
            )
            for part, j, a, b in sources
        ]

    def _on(self, worker: str, name: str, fn, *args, priority: int = PRIORITY):
        """``fn(*args)`` as a task pinned to ``worker``, keyed ``name`` and this move's
        token (copies are from and into a worker's own actors: nowhere else will do)."""
        return self.client.submit(
            fn,
            *args,
            workers=[worker],
            allow_other_workers=False,
            pure=False,
            priority=priority,
            key=f"{name}-{self.token}",
        )

    def _rows(self, old: Handover, s: int) -> tuple:
        if old.mirrored:
            return ({},)
        donors = [j for j, _, _ in self.layout.sources(s, old.layout)]
        return (
            {
                j: LocalRows(old.model_id)
                if old.workers[j] == self.workers[s]
                else self._on(
                    old.workers[j],
                    f"handover-rows-{j}-{s}",
                    rows_for,
                    old.model_id,
                    j,
                    self.layout,
                    s,
                )
                for j in donors
            },
        )


def rows_crossing(old: Placement, new: Placement) -> int:
    """Output rows whose worker changes from ``old`` to ``new``."""
    moved = 0
    for s, worker in enumerate(new.workers):
        for j, here, _ in new.layout.sources(s, old.layout):
            moved += len(here) if old.workers[j] != worker else 0
    return moved

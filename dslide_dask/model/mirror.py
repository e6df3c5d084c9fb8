"""A shard's rows streamed to the shards of a new layout while it trains on.

A live re-balance must give the new shards the old shards' rows as they are when training
switches to them. Copying every moving row at that moment stops training for as long as
the copy takes; and the rows cannot be sent ahead and patched up at the switch, because
most of a wide layer's rows change every few steps. So the rows go ahead, a slice a step,
each row as it is after some step; from then on the old shard sends, each step, only what
that step did to the rows already sent: the logit gradients of their entries
(:func:`~dslide_dask.kernels.mirror.entries_of`), which the new shard replays through the
same Adam kernel in the same order. The new rows stay bit for bit the old ones, and the
switch waits only for the last step's replay.

:class:`RowMirror` is the sending side, :class:`Replica` the receiving one; how the
messages travel is the caller's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dslide_dask.kernels import adam
from dslide_dask.kernels.mirror import entries_of
from dslide_dask.model import shared_negatives
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.wide_shard import WideShard

#: Bytes of rows an old shard copies out after a step while it streams them (about 10
#: steps for a shard of amazon-670k; more steps for a larger one).
BYTES_PER_STEP = 32 << 20


def replayable(cfg: SlideConfig) -> bool:
    """Whether a replay gives a shard's rows the same bits: not with bfloat16 moments
    (rounded stochastically by the row's index in its shard) nor with dense Adam (every
    row changes every step: the updates are the rows again)."""
    return cfg.optimizer == "adam" and cfg.moment_dtype == "float32"


@dataclass(frozen=True)
class Update:
    """One step's update of the rows a receiver holds, as the sender applied it."""

    h: np.ndarray  #: the layer input the step's update read (after dropout)
    rows: np.ndarray  #: the receiver's local ids, ascending
    counts: np.ndarray  #: entries of each row
    vec: np.ndarray  #: example of each entry
    coef: np.ndarray  #: logit gradient of each entry
    lr: float
    salt: int
    #: the batch's shared negatives among the receiver's rows (its local ids, ascending),
    #: with their row and bias gradients (:mod:`.shared_negatives`)
    shared_rows: np.ndarray | None = None
    shared_grads: np.ndarray | None = None
    shared_bias: np.ndarray | None = None


@dataclass(frozen=True)
class MirrorMessage:
    """What one old shard sends one new shard after a step (or at once, ``update`` None)."""

    source: int  #: the old shard
    seq: int  #: messages from one source are applied in this order
    step: int  #: the old shard's step count: what the receiver's rows are as of
    counters: dict[str, int]  #: the old shard's (:meth:`WideShard.state`)
    update: Update | None  #: the step's update of the rows sent before
    here: np.ndarray | None = None  #: the receiver's local ids of the rows this brings
    arrays: dict[str, np.ndarray] | None = None  #: those rows, as after the step


@dataclass
class _Target:
    shard: int
    here: np.ndarray  #: its local ids of this shard's rows it will hold
    there: np.ndarray  #: their local ids here
    per_step: int
    to_new: np.ndarray  #: its local id of each row here already sent (-1: not, or not its)
    sent: int = 0
    seq: int = 0


class RowMirror:
    """Streams a shard's rows to the shards of ``layout`` (all its rows: those staying
    on this worker too, since the shard holding them is a new one)."""

    def __init__(self, shard: WideShard, layout: ShardLayout) -> None:
        self.source = shard.shard_index
        shard.keep_updates = True  # each step's update of the rows sent goes after them
        arrays = shard.state()[0]
        steps = max(1, -(-sum(arrays[n].nbytes for n in shard.kept_arrays()) // BYTES_PER_STEP))
        self.targets = [
            _Target(
                k, here, there, max(1, -(-len(here) // steps)), np.full(shard.n_local, -1, np.int32)
            )
            for k in range(layout.n_shards)
            for j, here, there in layout.sources(k, shard.layout)
            if j == self.source
        ]

    @property
    def done(self) -> bool:
        """Whether every row has been sent (from then on, only updates are)."""
        return all(t.sent == len(t.here) for t in self.targets)

    def after_step(
        self, shard: WideShard, rest: bool = False, rows: bool = True
    ) -> list[tuple[int, MirrorMessage]]:
        """``(new shard, message)`` for each receiver, right after a step of ``shard`` (the
        step's update of the rows sent, then the next slice of rows; ``rows=False``: no
        slice this time); ``rest``: no step was taken since the last call, send every row
        not sent yet."""
        step, counters = shard.step, shard.state()[1]
        last = shard.last_update
        out = []
        for t in self.targets:
            update = None
            if not rest and t.sent and last is not None and last[0] == step:
                update = _update_of(last, t.to_new)
            n = len(t.here) - t.sent if rest else min(t.per_step * rows, len(t.here) - t.sent)
            if rest and not n:
                continue
            here = there = arrays = None
            if n:
                here, there = t.here[t.sent : t.sent + n], t.there[t.sent : t.sent + n]
                arrays = shard.rows(there)
                t.to_new[there] = here
                t.sent += n
            out.append(
                (t.shard, MirrorMessage(self.source, t.seq, step, counters, update, here, arrays))
            )
            t.seq += 1
        return out


def _update_of(last: tuple, to_new: np.ndarray) -> Update:
    _, (offsets, entry_pos, entry_vec, touched), coefs, h, lr, salt, shared = last
    rows, counts, vec, coef = entries_of(offsets, entry_pos, entry_vec, touched, coefs, to_new)
    if shared is None:
        return Update(h, rows, counts, vec, coef, lr, salt)
    shared_rows, grads, bias = shared
    there = to_new[shared_rows]
    sent = there >= 0  # to_new increases with the row: the receiver's ids stay ascending
    return Update(h, rows, counts, vec, coef, lr, salt, there[sent], grads[sent], bias[sent])


class Replica:
    """A new shard filled by the :class:`RowMirror` of each old shard holding its rows:
    messages applied in each source's order (they may arrive out of it); once every row
    is in, it hashes them into its tables and is :attr:`ready`."""

    def __init__(self, shard: WideShard, old: ShardLayout) -> None:
        self.shard = shard
        sources = shard.layout.sources(shard.shard_index, old)
        self.missing = {j: len(here) for j, here, _ in sources}
        self.next = dict.fromkeys(self.missing, 0)
        self.held: dict[int, dict[int, MirrorMessage]] = {j: {} for j in self.missing}
        self.steps = dict.fromkeys(self.missing, -1)  #: each source's step applied
        self.ready = False

    @property
    def step(self) -> int:
        """The step every source's rows here are as of (-1: none yet)."""
        return min(self.steps.values())

    def take(self, message: MirrorMessage) -> None:
        j = message.source
        self.held[j][message.seq] = message
        while (m := self.held[j].pop(self.next[j], None)) is not None:
            self.next[j] += 1
            self._apply(m)

    def _apply(self, m: MirrorMessage) -> None:
        shard = self.shard
        if m.update is not None:
            replay(shard, m.update)
        if m.here is not None:
            assert m.arrays is not None  # a message with rows carries their arrays
            shard.put_rows(m.here, m.arrays)
            self.missing[m.source] -= len(m.here)
        self.steps[m.source] = m.step
        if self.ready:
            shard.set_counters(m.counters, rehash=False)  # redraws if the source did
        elif not any(self.missing.values()):
            shard.set_counters(m.counters)  # hashes every row into the tables
            self.ready = True


def replay(shard: WideShard, u: Update) -> None:
    """Apply an update another shard applied to rows this one holds, through the same
    kernel, each row's entries in the same order: the same arithmetic on each row, so
    the same bits (without the gradient w.r.t. the input, which only the sender needs)."""
    rows = u.rows.astype(np.int64)
    offsets = np.zeros(shard.n_local + 1, np.int64)
    offsets[rows + 1] = u.counts
    np.cumsum(offsets, out=offsets)
    cfg = shard.cfg
    adam.adam_grouped(
        offsets,
        np.arange(len(u.coef), dtype=np.int64),
        u.vec,
        rows,
        u.coef,
        u.h,
        *shard.adam_arrays(),
        u.lr,
        cfg.beta1,
        cfg.beta2,
        cfg.eps,
        np.zeros((0, 0), np.float32),
        u.salt,
    )
    if u.shared_rows is not None and u.shared_grads is not None and u.shared_bias is not None:
        shared_negatives.adam_step(
            shard, u.shared_rows.astype(np.int64), u.shared_grads, u.shared_bias, u.lr, u.salt
        )

"""A shard's rows in and out (:mod:`.wide_shard`): its per-neuron arrays and counters as
checkpoints, live moves (:mod:`.mirror`, :mod:`dslide_dask.distributed.moves.handover`) and
early stopping take and give them.

Apart from the shard's arithmetic because it is a job of its own: it reads and writes
the arrays the training step updates, and never takes a step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dslide_dask.kernels import rows
from dslide_dask.kernels.bfloat16 import convert
from dslide_dask.model.optimizer import with_row_updates

if TYPE_CHECKING:
    from dslide_dask.model.config import SlideConfig
    from dslide_dask.model.lsh_index import LSHIndex, RebuildSchedule
    from dslide_dask.model.wide_shard import WideShard


#: Per-neuron arrays that stay zero with ``beta1 = 0`` (Adam keeps no first moment).
FIRST_MOMENTS = ("W.m", "bias.m")


class ShardRows:
    """The rows of :class:`~.wide_shard.WideShard` (the attributes it uses: the arrays
    ``W``, ``bias``, ``W_m``, ``W_v``, ``bias_m``, ``bias_v``, ``W_n``, and ``cfg``,
    ``n_local``, ``step``, ``seed``, ``schedule``, ``_index``, ``_unbuilt``)."""

    #: Per-neuron arrays, in local row order: what a checkpoint keeps of a shard.
    ROW_ARRAYS = ("W", "bias", "W.m", "W.v", "bias.m", "bias.v", "W.n")

    # What the host shard sets (WideShard.__init__); declared here, set there.
    W: np.ndarray
    bias: np.ndarray
    W_m: np.ndarray
    W_v: np.ndarray
    bias_m: np.ndarray
    bias_v: np.ndarray
    W_n: np.ndarray
    cfg: SlideConfig
    n_local: int
    step: int
    seed: int
    schedule: RebuildSchedule
    _index: LSHIndex
    _unbuilt: bool  #: the tables wait for a first build (a fresh layer's)
    _best: tuple[np.ndarray, np.ndarray] | None

    def rehash(self) -> None:
        """Rebuild the hash tables from the rows as they are."""
        self._index.rebuild(self.W)
        self._unbuilt = False

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """``(per-neuron arrays named as ROW_ARRAYS, counters)``. The hash tables are
        not part of it: :meth:`set_state` rebuilds them from the weights."""
        arrays = dict(
            zip(
                self.ROW_ARRAYS,
                (self.W, self.bias, self.W_m, self.W_v, self.bias_m, self.bias_v, self.W_n),
                strict=True,
            )
        )
        sched = self.schedule
        counters = {
            "step": self.step,
            "n_rebuilds": sched.n_rebuilds,
            "next_rebuild": sched.next_rebuild,
            "next_redraw": sched.next_redraw or 0,
            "n_draws": self._index.n_draws,
        }
        return arrays, counters

    def set_state(self, arrays: dict[str, np.ndarray], counters: dict[str, int]) -> None:
        """Take per-neuron arrays (this shard's rows, local order) and counters."""
        arrays = with_row_updates(arrays, "W.n", self.n_local, int(counters["step"]))
        if missing := [name for name in self.kept_arrays() if name not in arrays]:
            raise ValueError(f"no {', '.join(missing)}")
        self.put_rows(slice(None), arrays)
        self.set_counters(counters)

    def kept_arrays(self) -> tuple[str, ...]:
        """The per-neuron arrays that hold anything: :attr:`ROW_ARRAYS`, less the first
        moments with ``beta1 = 0`` (never written; what checkpoints and moves carry)."""
        unkept = FIRST_MOMENTS if self.cfg.beta1 == 0 else ()
        return tuple(name for name in self.ROW_ARRAYS if name not in unkept)

    def rows(self, local: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of some rows' kept arrays, for a live re-balance to move elsewhere."""
        arrays, _ = self.state()
        return {name: rows.take_rows(arrays[name], local) for name in self.kept_arrays()}

    def copy_rows(self, local: np.ndarray, other: WideShard, there: np.ndarray) -> None:
        """Take rows ``there`` of another shard of this model (in this process) as rows
        ``local``, straight across; rehash after."""
        mine, theirs = self.state()[0], other.state()[0]
        for name in self.kept_arrays():
            rows.copy_rows(mine[name], local, theirs[name], there)

    def put_rows(self, local: np.ndarray | slice, arrays: dict[str, np.ndarray]) -> None:
        """Take some rows of per-neuron arrays (moments float32 or bfloat16); rehash after."""
        mine, _ = self.state()
        n = self.n_local if isinstance(local, slice) else len(local)
        for name, value in arrays.items():
            if name not in mine:
                raise ValueError(f"{name}: not a per-neuron array of a shard")
            want = (n, *mine[name].shape[1:])
            if value.shape != want:
                raise ValueError(f"{name}: shape {value.shape}, shard needs {want}")
            value = convert(value, mine[name])
            if isinstance(local, slice):
                mine[name][local] = value
            else:  # straight into place, no gathered copy between
                rows.copy_rows(mine[name], local, np.ascontiguousarray(value), np.arange(n))

    def set_counters(self, counters: dict[str, int], rehash: bool = True) -> None:
        """Take :meth:`state`'s counters; redraw the hash functions and rebuild the tables
        (``rehash=False``: keep the tables, built from these rows a few steps ago, unless
        the hash functions changed since)."""
        self.step = int(counters["step"])
        sched = self.schedule
        sched.n_rebuilds = int(counters["n_rebuilds"])
        sched.next_rebuild = int(counters["next_rebuild"])
        sched.next_redraw = int(counters["next_redraw"]) or None
        n_draws = int(counters["n_draws"])
        if rehash or n_draws != self._index.n_draws:
            self._index.draw(self.seed + n_draws - 1)
            self._index.n_draws = n_draws
            self.rehash()

    def remember(self) -> None:
        """Keep a copy of the weights and biases (early stopping's best model so far)."""
        self._best = (self.W.copy(), self.bias.copy())

    def recall(self) -> bool:
        """Put back the weights :meth:`remember` kept and rehash them; False if none.
        The optimiser's moments are not rewound: they only matter if training goes on."""
        best = getattr(self, "_best", None)
        if best is None:
            return False
        self.W[...], self.bias[...] = best
        self.rehash()
        return True

"""Which shard owns which neuron of a wide layer.

Neurons are dealt to shards by a repeating pattern: with equal capacities it is plain
striding (``0, 1, ..., S-1, 0, 1, ...``); a shard with twice the capacity appears twice
as often. Dealing (rather than contiguous ranges) spreads frequent and rare labels
evenly, whatever order the label ids come in.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ShardLayout:
    """A pattern of shard indices repeated over the neuron ids ``0 .. n_neurons-1``."""

    n_neurons: int
    pattern: tuple[int, ...]
    # Derived from the pattern by __post_init__: no part of __init__, eq, hash or repr.
    _pattern: np.ndarray = field(init=False, repr=False, compare=False)
    _counts: np.ndarray = field(init=False, repr=False, compare=False)
    _ranks: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pattern = tuple(int(s) for s in self.pattern)
        object.__setattr__(self, "pattern", pattern)
        if not pattern or sorted(set(pattern)) != list(range(max(pattern) + 1)):
            raise ValueError(f"pattern must use every shard 0..S-1, got {pattern}")
        if self.n_neurons < len(pattern):
            raise ValueError(
                f"n_neurons ({self.n_neurons}) must be >= the pattern length ({len(pattern)})"
            )
        pat = np.array(pattern)
        object.__setattr__(self, "_pattern", pat)
        counts = np.bincount(pat)
        object.__setattr__(self, "_counts", counts)
        # rank of each pattern slot among the slots of the same shard
        ranks = np.array([int((pat[:i] == pat[i]).sum()) for i in range(len(pat))])
        object.__setattr__(self, "_ranks", ranks)

    @classmethod
    def strided(cls, n_neurons: int, n_shards: int) -> ShardLayout:
        return cls(n_neurons, tuple(range(n_shards)))

    @classmethod
    def from_capacities(cls, n_neurons: int, capacities: Sequence[int]) -> ShardLayout:
        """A pattern where shard s appears ``capacities[s]`` times, interleaved
        (smooth weighted round robin), e.g. capacities (2, 1) -> (0, 1, 0)."""
        caps = [int(c) for c in capacities]
        if not caps or min(caps) < 1:
            raise ValueError(f"capacities must be positive integers, got {list(capacities)}")
        credit = [0] * len(caps)
        pattern = []
        for _ in range(sum(caps)):
            credit = [c + w for c, w in zip(credit, caps, strict=True)]
            best = max(range(len(caps)), key=lambda s: credit[s])
            credit[best] -= sum(caps)
            pattern.append(best)
        return cls(n_neurons, tuple(pattern))

    def rebalanced(self, capacities: Sequence[int], new_index: Sequence[int | None]) -> ShardLayout:
        """A layout with shares close to ``capacities`` that moves as few neurons as it
        can from this one, for a model re-balanced live.

        Old shard ``j`` becomes shard ``new_index[j]`` (None: it goes away). The pattern is
        this one repeated (to about ``RESOLUTION`` slots a shard, for fine shares), with
        evenly spread slots of the shards over their share handed to those under it: a
        neuron changes shard only when a share asks for it, whereas a fresh
        :meth:`from_capacities` pattern would re-deal nearly every neuron.
        """
        caps = np.asarray([int(c) for c in capacities], np.float64)
        if len(new_index) != self.n_shards or not len(caps) or caps.min() < 1:
            raise ValueError(
                f"need a new index for each of the {self.n_shards} shards and positive "
                f"capacities, got {list(new_index)} and {list(capacities)}"
            )
        period = len(self._pattern)
        reps = max(1, math.ceil(RESOLUTION * len(caps) / period))
        reps = max(1, min(reps, self.n_neurons // period))
        remap = np.array([-1 if s is None else int(s) for s in new_index])
        pattern = remap[np.tile(self._pattern, reps)]
        n = len(pattern)
        if n < len(caps):
            return ShardLayout.from_capacities(self.n_neurons, capacities)
        target = _apportion(n, caps)
        have = np.bincount(pattern[pattern >= 0], minlength=len(caps))
        freed = [np.flatnonzero(pattern < 0)]
        for s in np.flatnonzero(have > target):
            slots = np.flatnonzero(pattern == s)
            excess = have[s] - target[s]
            freed.append(slots[np.linspace(0, len(slots), excess, endpoint=False).astype(int)])
        pool = np.sort(np.concatenate(freed))
        short = {int(s): int(target[s] - have[s]) for s in np.flatnonzero(have < target)}
        credit = dict.fromkeys(short, 0)
        for slot in pool:  # smooth round robin by deficit, so takers interleave
            for taker in credit:
                credit[taker] += short[taker]
            best = max(credit, key=credit.__getitem__)
            credit[best] -= len(pool)
            pattern[slot] = best
        return ShardLayout(self.n_neurons, tuple(pattern.tolist()))

    def sources(self, shard: int, old: ShardLayout) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Where ``shard`` of this layout finds its neurons in an ``old`` layout: for each
        old shard holding some, ``(old shard, local rows here, local rows there)``
        (read-only arrays, kept for the next call: a move asks for them several times)."""
        return _sources(self, shard, old)

    @property
    def n_shards(self) -> int:
        return len(self._counts)

    def owner(self, ids: np.ndarray) -> np.ndarray:
        """Shard index of each global id."""
        return self._pattern[np.asarray(ids) % len(self._pattern)]

    def to_local(self, ids: np.ndarray) -> np.ndarray:
        """Local index of each global id within its owner shard."""
        ids = np.asarray(ids, np.int64)
        period, slot = np.divmod(ids, len(self._pattern))
        return period * self._counts[self._pattern[slot]] + self._ranks[slot]

    def global_ids(self, shard: int, local: np.ndarray) -> np.ndarray:
        """Global ids of a shard's local indices."""
        slots = np.flatnonzero(self._pattern == shard)
        period, rank = np.divmod(np.asarray(local, np.int64), len(slots))
        return period * len(self._pattern) + slots[rank]

    def size(self, shard: int) -> int:
        """How many neurons a shard owns."""
        period = len(self._pattern)
        full, rest = divmod(self.n_neurons, period)
        return int(full * self._counts[shard] + (self._pattern[:rest] == shard).sum())


@functools.lru_cache(maxsize=16)
def _sources(
    new: ShardLayout, shard: int, old: ShardLayout
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    mine = new.global_ids(shard, np.arange(new.size(shard)))
    owners = old.owner(mine)
    out = []
    for j in np.unique(owners):
        here = np.flatnonzero(owners == j)
        there = old.to_local(mine[here])
        here.flags.writeable = there.flags.writeable = False
        out.append((int(j), here, there))
    return out


#: Pattern slots per shard a re-balanced layout aims at (its shares' resolution).
RESOLUTION = 64


def _apportion(n: int, weights: np.ndarray) -> np.ndarray:
    """``n`` slots split in proportion to ``weights`` (largest remainders), at least
    one each."""
    exact = n * weights / weights.sum()
    out = np.maximum(np.floor(exact).astype(np.int64), 1)
    while out.sum() > n:
        out[np.argmax(out - exact)] -= 1
    order = np.argsort(-(exact - out), kind="stable")
    for s in order[: n - out.sum()]:
        out[s] += 1
    return out

"""Which shard owns which neuron of a wide layer.

Neurons are dealt to shards by a repeating pattern: with equal capacities it is plain
striding (``0, 1, ..., S-1, 0, 1, ...``); a shard with twice the capacity appears twice
as often. Dealing (rather than contiguous ranges) spreads frequent and rare labels
evenly, whatever order the label ids come in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardLayout:
    """A pattern of shard indices repeated over the neuron ids ``0 .. n_neurons-1``."""

    n_neurons: int
    pattern: tuple[int, ...]

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

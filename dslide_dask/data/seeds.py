"""Seeds derived from a seed and integers (a split, a chunk, an epoch, a tag), so that
each part of a deterministic computation draws from a stream of its own: the chunks of
a synthetic data set (:mod:`.synthetic`) and the orders of a shuffled epoch
(:mod:`.shuffle`). Part of their determinism contract: changing it changes the data
generated and the batches drawn."""

from __future__ import annotations

import numpy as np

from dslide_dask.kernels.tables import mix64

_MASK64 = (1 << 64) - 1


def derive_seed(*parts: int) -> int:
    """A 64-bit seed from integers (splitmix64 chain)."""
    h = 0x853C49E6748FEA9B
    for p in parts:
        h = _splitmix((h ^ (int(p) & _MASK64)) & _MASK64)
    return h


def _splitmix(x: int) -> int:
    return int(mix64(np.uint64((x + 0x9E3779B97F4A7C15) & _MASK64)))

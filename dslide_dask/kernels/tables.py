"""Fixed-capacity LSH hash tables: ``ids[L, n_buckets, capacity]`` with insertion counts.

``counts[t, b]`` is how many ids were ever offered to bucket b of table t. Once a bucket
is full, FIFO overwrites the oldest entry (a ring) and reservoir sampling keeps each
offered id with probability ``capacity / offered`` (a uniform sample of all offered ids).
"""

import numba
import numpy as np

FIFO = 0
RESERVOIR = 1


@numba.njit(cache=True, nogil=True, inline="always")
def mix64(x: np.uint64) -> np.uint64:
    """splitmix64 finaliser: a stateless hash used as a deterministic random source."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@numba.njit(cache=True, nogil=True, parallel=True)
def insert(
    ids: np.ndarray,
    counts: np.ndarray,
    buckets: np.ndarray,
    items: np.ndarray,
    policy: int,
    seed: int,
) -> None:
    """Offer ``items[i]`` to bucket ``buckets[i, t]`` of every table t (tables in parallel)."""
    L, _, capacity = ids.shape
    for t in numba.prange(L):
        salt = mix64(np.uint64(seed) * np.uint64(1000003) + np.uint64(t))
        for i in range(items.shape[0]):
            b = buckets[i, t]
            seen = counts[t, b]
            if seen < capacity:
                slot = seen
            elif policy == FIFO:
                slot = seen % capacity
            else:
                r = mix64(salt ^ (np.uint64(i) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seen)))
                slot = np.int64(r % np.uint64(seen + 1))
            if slot < capacity:
                ids[t, b, slot] = items[i]
            counts[t, b] = seen + 1


@numba.njit(cache=True, nogil=True, parallel=True)
def clear(counts: np.ndarray) -> None:
    """Empty every bucket (the ids stay but are no longer counted)."""
    for t in numba.prange(counts.shape[0]):
        counts[t, :] = 0

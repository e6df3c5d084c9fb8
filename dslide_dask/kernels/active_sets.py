"""Active sets: for each example, the output neurons it will compute.

The true labels come first, then the neurons found in the example's L buckets, chosen by
a sampling strategy, then random neurons up to a minimum. Examples are processed in
parallel chunks, each with its own scratch (no locks, no races): a counter a neuron for
the buckets' neurons, and a bit a neuron for the random ones. The draws test a bitset
that stays in cache (84 KB at 670K neurons) where a counter array (2.7 MB a chunk) did
not: padding 1,500 neurons an example went from 5.3 to 0.8 ms a batch of 256.

A batch may also share random neurons that every example scores (``shared_pos``): those
are left out of the per-example sets, and ``shared_kind`` says, for each example and
shared neuron, whether it is one of the example's labels, was retrieved by its tables,
or is a plain random negative.
"""

import numba
import numpy as np

from dslide_dask.kernels.tables import mix64

#: Examples are split into at most this many chunks, each with its own scratch array.
N_CHUNKS = 16

UNION = 0  # every neuron met in any bucket (tables visited in a rotating order)
TOPK = 1  # the neurons met in the most buckets
THRESHOLD = 2  # the neurons met in at least `threshold` buckets

SHARED_RANDOM = 0  # shared_kind: a random negative of the example
SHARED_FOUND = 1  # retrieved from the example's buckets
SHARED_LABEL = 2  # one of the example's labels


def scratch(n_chunks: int, n_neurons: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed ``(counters, marks)`` scratch of :func:`active_sets` for ``n_chunks`` chunks
    over ``n_neurons`` neurons."""
    return (
        np.zeros((n_chunks, n_neurons), np.int32),
        np.zeros((n_chunks, (n_neurons + 63) // 64), np.uint64),
    )


@numba.njit(cache=True, nogil=True, parallel=True)
def active_sets(
    buckets: np.ndarray,
    table_ids: np.ndarray,
    table_counts: np.ndarray,
    label_ptr: np.ndarray,
    label_ids: np.ndarray,
    n_neurons: int,
    strategy: int,
    threshold: int,
    min_active: int,
    max_active: int,
    seed: int,
    scratch: np.ndarray,
    marks: np.ndarray,
    shared_pos: np.ndarray,
    shared_kind: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Active neuron ids ``[B, max_active]`` with per-example counts: active, labels, and
    labels plus table neurons (random padding fills ``n_found[b]:n_active[b]``).

    ``buckets[b, t]`` is example b's bucket in table t; ``label_ids[label_ptr[b]:
    label_ptr[b+1]]`` its labels (local ids, kept first and never dropped: the caller sizes
    ``max_active`` to hold them). ``scratch`` and ``marks`` (:func:`scratch`: a counter and
    a bit a neuron, for each chunk of examples) are zeros and are left zeroed.

    ``shared_pos`` (empty, or ``[n_neurons]`` int32: a neuron's index among the batch's
    shared neurons, -1 if not shared) and ``shared_kind`` (``[B, n_shared]`` uint8 zeros,
    filled): shared neurons are not put in the rows but marked in ``shared_kind`` as
    SHARED_LABEL or SHARED_FOUND (they then take no place in ``max_active``).
    """
    B, L = buckets.shape
    capacity = table_ids.shape[2]
    n_chunks = scratch.shape[0]
    active = np.empty((B, max_active), np.int32)
    n_active = np.zeros(B, np.int32)
    n_label = np.zeros(B, np.int32)
    n_found = np.zeros(B, np.int32)  # labels + neurons from the tables; padding after
    shared = shared_pos.shape[0] > 0
    for c in numba.prange(n_chunks):
        seen = scratch[c]
        bits = marks[c]
        cand = np.empty(L * capacity, np.int32)
        hits = np.empty(L * capacity, np.int32)
        for b in range(c * B // n_chunks, (c + 1) * B // n_chunks):
            cnt = 0
            for p in range(label_ptr[b], label_ptr[b + 1]):
                lab = label_ids[p]
                if shared and shared_pos[lab] >= 0:
                    shared_kind[b, shared_pos[lab]] = SHARED_LABEL
                elif seen[lab] == 0:
                    seen[lab] = -1
                    active[b, cnt] = lab
                    cnt += 1
            n_label[b] = cnt
            nc = 0
            start = (seed + b) % L if L > 0 else 0
            for r in range(L):
                t = (start + r) % L
                bucket = buckets[b, t]
                size = min(table_counts[t, bucket], capacity)
                for s in range(size):
                    n = table_ids[t, bucket, s]
                    if shared and shared_pos[n] >= 0:
                        if shared_kind[b, shared_pos[n]] == SHARED_RANDOM:
                            shared_kind[b, shared_pos[n]] = SHARED_FOUND
                    elif seen[n] == 0:
                        cand[nc] = n
                        nc += 1
                        seen[n] = 1
                    elif seen[n] > 0:
                        seen[n] += 1
            room = max_active - cnt
            if strategy == TOPK and nc > room:
                for i in range(nc):
                    hits[i] = -seen[cand[i]]
                order = np.argsort(hits[:nc], kind="mergesort")
                for i in range(room):
                    active[b, cnt] = cand[order[i]]
                    cnt += 1
            else:
                for i in range(nc):
                    if cnt >= max_active:
                        break
                    if strategy != THRESHOLD or seen[cand[i]] >= threshold:
                        active[b, cnt] = cand[i]
                        cnt += 1
            n_found[b] = cnt
            # the padding skips the labels and every candidate, taken or not: their bits
            for i in range(nc):
                n = cand[i]
                bits[n >> 6] |= np.uint64(1) << np.uint64(n & 63)
                seen[n] = 0
            for i in range(n_label[b]):
                n = active[b, i]
                bits[n >> 6] |= np.uint64(1) << np.uint64(n & 63)
                seen[n] = 0
            target = min(min_active, max_active, n_neurons)
            draw = np.uint64(0)
            base = mix64(np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(b))
            while cnt < target and draw < np.uint64(8 * target + 64):
                n = np.int32(mix64(base + draw) % np.uint64(n_neurons))
                draw += np.uint64(1)
                word, bit = n >> 6, np.uint64(1) << np.uint64(n & 63)
                if bits[word] & bit == 0:
                    bits[word] |= bit
                    active[b, cnt] = n
                    cnt += 1
            n_active[b] = cnt
            for i in range(nc):
                bits[cand[i] >> 6] = 0
            for i in range(cnt):
                bits[active[b, i] >> 6] = 0
    return active, n_active, n_label, n_found

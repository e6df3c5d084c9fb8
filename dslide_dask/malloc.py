"""glibc's malloc thresholds where training runs: large temporaries reuse heap pages.

A step allocates and frees tens of megabytes of temporaries (grouped entries, logits,
gathered activations). Left to itself, glibc serves each from the heap only once one
as large was freed, and returns free heap top beyond twice that size to the OS: a
670K-label step's temporaries were faulted in afresh, page by page, every step (a step
on two threads: 50.4-52.9 ms, 39.6-42.8 ms with the thresholds below). On Dask workers
it is worse: the nanny starts them with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), which also freezes the mmap threshold at its
128 KiB floor, so every larger allocation is a fresh ``mmap``: each 256 KiB socket read
of an HTTP body, each converted chunk, each step's activations and gradients.

:func:`raise_malloc_thresholds` sets what glibc itself would reach at its ceiling:
allocations under 32 MiB come from the heap, and up to twice that of free heap top is
kept rather than trimmed, so freed pages are reused. Big long-lived arrays (weights,
moments, tables) are still mapped on their own and go back to the OS when freed. The
actors call it as they start on a worker, the in-process trainer as it is built: the
process then keeps up to 64 MiB of free heap rather than returning it.
"""

from __future__ import annotations

import ctypes

#: 32 MiB: glibc's ceiling for its dynamic mmap threshold, and the largest value every
#: glibc accepts (older ones refuse more than HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's <malloc.h>


def raise_malloc_thresholds(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Have this process's glibc serve allocations under ``nbytes`` from the heap and
    keep up to ``2 * nbytes`` of free heap top (glibc's own rule for the pair).

    Returns whether the C library took them: False where it is not glibc (macOS has no
    ``mallopt``; musl's ignores it), and nothing else changes.
    """
    if not 0 < nbytes <= MMAP_THRESHOLD:
        raise ValueError(f"nbytes must be in (0, {MMAP_THRESHOLD}], got {nbytes}")
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took_mmap = mallopt(_M_MMAP_THRESHOLD, nbytes)
    took_trim = mallopt(_M_TRIM_THRESHOLD, 2 * nbytes)
    return bool(took_mmap and took_trim)


def trim_heap() -> bool:
    """Return this process's free heap pages to the OS, wherever they are in the heap
    (glibc's ``malloc_trim(0)``): many small arrays freed while a large one is filled
    (a label tree's node parts as the tree is joined) would otherwise stay resident
    beside it. False where the C library has no ``malloc_trim``."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True

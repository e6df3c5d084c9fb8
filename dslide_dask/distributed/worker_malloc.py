"""glibc's malloc thresholds on worker processes: large temporaries reuse heap pages.

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``) so that freed memory goes back to the OS.
Setting it also freezes glibc's mmap threshold at its 128 KiB floor. Every larger
allocation is then a fresh ``mmap`` whose pages fault in one by one, unmapped again when
freed: each 256 KiB socket read of an HTTP body, each converted chunk, each step's
gathered activations and gradients, a cost paid on every read and every step.

:func:`raise_malloc_thresholds` sets what glibc itself would reach without that
variable, at its ceiling: allocations under 32 MiB come from the heap, and up to twice
that of free heap top is kept rather than trimmed, so freed pages are reused. Big
long-lived arrays (weights, moments, tables) are still mapped on their own and go back
to the OS when freed. The actors call it as they start on a worker.
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

"""Memory a size read from a file may claim, checked before anything is allocated.

Headers, checkpoint metadata and model metadata carry sizes that a damaged or hostile
file can set to anything; allocating first turns them into a MemoryError traceback or an
OOM kill. :func:`check_memory` compares the bytes a size implies with what this machine
has free and raises :class:`MemoryBudgetError` naming them.
"""

from __future__ import annotations

import os

from dslide_dask.errors import MemoryBudgetError


def available_bytes() -> int:
    """Bytes this process could still allocate: MemAvailable, capped by RLIMIT_AS."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = 1 << 62  # unknown: no bound from memory (sizes are still checked)
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            free = min(free, soft)
    except (ImportError, ValueError, OSError):
        pass
    return free


def check_memory(nbytes: int, what: str) -> None:
    """Raise :class:`MemoryBudgetError` if ``nbytes`` (for ``what``) exceed the free memory."""
    free = available_bytes()
    if nbytes > free:
        raise MemoryBudgetError(
            f"{what} needs {nbytes:,} bytes ({_human(nbytes)}), more than the "
            f"{_human(free)} of memory available"
        )


def model_bytes(hidden: tuple[int, ...], n_features: int, n_labels: int) -> int:
    """Bytes of a network's weights and two Adam moments (float32): a lower bound of what
    building it allocates."""
    widths = (n_features, *hidden)
    params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    params += n_labels * (hidden[-1] + 1)
    return 3 * 4 * params


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover

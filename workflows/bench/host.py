"""What else the machine was doing while a benchmark ran: one reader of ``/proc/stat``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

#: CPU use by other processes (in cores) during a contender's run that earns a warning.
BUSY_CORES = 0.2
#: The first eight fields of /proc/stat's "cpu" line (guest time is counted in user).
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def busy_cpu_seconds(interrupts: bool = True) -> float | None:
    """Non-idle CPU seconds of the whole machine since boot (Linux; else None): user,
    nice, system and steal (other guests of the hypervisor), and with ``interrupts`` the
    kernel's interrupt time too. Leave interrupts out where the kernel's work is our own
    (moving packets between emulated nodes' veths)."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    cpu = dict(zip(FIELDS, values + [0] * (len(FIELDS) - len(values)), strict=True))
    busy = cpu["user"] + cpu["nice"] + cpu["system"] + cpu["steal"]
    if interrupts:
        busy += cpu["irq"] + cpu["softirq"]
    return busy / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def other_cpu(out: dict) -> Iterator[None]:
    """Set ``out["other_cpu_cores"]``: CPU the machine spent outside this process tree
    during the block, in cores (timings are inflated when it is high)."""
    # interrupts left out: there the kernel moves our own packets between the veths
    t0, busy0, ours0 = time.perf_counter(), busy_cpu_seconds(False), _tree_cpu_seconds()
    yield
    wall, busy1, ours1 = time.perf_counter() - t0, busy_cpu_seconds(False), _tree_cpu_seconds()
    if busy0 is not None and busy1 is not None:
        out["other_cpu_cores"] = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall


def _tree_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total

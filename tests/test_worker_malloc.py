"""The actors' malloc setting: large temporaries stop faulting in fresh pages."""

import os
import platform
import subprocess
import sys

import pytest

from dslide_dask.distributed.worker_malloc import MMAP_THRESHOLD, raise_malloc_thresholds

#: Allocate, fill and free a 1 MiB array 200 times; print the minor page faults taken.
CHURN = """
import resource, sys
import numpy as np
from dslide_dask.distributed.worker_malloc import raise_malloc_thresholds
if sys.argv[1] == "raise":
    assert raise_malloc_thresholds()
np.ones(1 << 18, np.float32)  # warm up numpy's own allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    np.ones(1 << 18, np.float32).sum()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}  # as Dask's nanny sets it
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_raised_threshold_reuses_pages_under_dasks_malloc_environment():
    plain, raised = _faults("plain"), _faults("raise")
    assert plain > 200 * 200  # ~256 pages faulted in for every 1 MiB array
    assert raised < plain / 20


@pytest.mark.parametrize("nbytes", [0, -1, MMAP_THRESHOLD + 1])
def test_threshold_out_of_range_is_refused(nbytes):
    with pytest.raises(ValueError, match=r"nbytes must be in \(0, 33554432\]"):
        raise_malloc_thresholds(nbytes)

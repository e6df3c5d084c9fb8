"""The malloc setting of actors and of the in-process trainer: large temporaries stop
faulting in fresh pages."""

import os
import platform
import subprocess
import sys

import pytest
from distributed import Client, LocalCluster

from dslide_dask import SlideConfig
from dslide_dask.distributed import DistributedTrainer
from dslide_dask.malloc import MMAP_THRESHOLD, raise_malloc_thresholds

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")

#: Allocate, fill and free a 1 MiB array 200 times; the minor page faults that took.
CHURN = """
import resource
import numpy as np

def churn_faults():
    np.ones(1 << 18, np.float32)  # numpy's own first allocations
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        np.ones(1 << 18, np.float32).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""
FAULTS_UNTUNED = 200 * 200  # ~256 pages faulted in for every 1 MiB array
FAULTS_TUNED = FAULTS_UNTUNED // 20


def _faults_in_subprocess(tuned: bool) -> int:
    code = CHURN + (
        "from dslide_dask.malloc import raise_malloc_thresholds\n"
        f"assert raise_malloc_thresholds() if {tuned} else True\n"
        "print(churn_faults())\n"
    )
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}  # as Dask's nanny sets it
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


#: Allocate 6 arrays of 3 MiB at once, fill and free them 50 times: glibc's own dynamic
#: thresholds then trim the 18 MiB freed at the heap's top every time. (Under 4 MiB, so
#: numpy does not ask for huge pages, which would fault in 2 MiB at a time.)
CHURN_STEP = """
import resource
import numpy as np

def step_faults():
    [np.ones(3 << 18, np.float32) for _ in range(6)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        arrays = [np.ones(3 << 18, np.float32) for _ in range(6)]
        sum(float(a.sum()) for a in arrays)
        del arrays
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""
STEP_FAULTS_UNTUNED = 50 * 6 * 768 // 4  # a quarter of the arrays' pages (about half seen)


@pytest.mark.slow
@glibc_only
@pytest.mark.parametrize("trainer", [False, True])
def test_the_in_process_trainer_raises_the_thresholds(trainer):
    """glibc's defaults fault a step's temporaries in afresh each time; building a
    LocalTrainer (what fit does in-process) stops that."""
    build = (
        "from dslide_dask import SlideConfig\n"
        "from dslide_dask.local_trainer import LocalTrainer\n"
        "LocalTrainer(SlideConfig(hidden=(8,), K=2, L=2, range_pow=4, seed=0), 20, 30)\n"
    )
    code = CHURN_STEP + (build if trainer else "") + "print(step_faults())\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    faults = int(out.stdout.split()[-1])
    assert faults < STEP_FAULTS_UNTUNED // 20 if trainer else faults > STEP_FAULTS_UNTUNED


@pytest.mark.slow
@glibc_only
def test_raised_thresholds_reuse_pages_under_dasks_malloc_environment():
    assert _faults_in_subprocess(tuned=False) > FAULTS_UNTUNED
    assert _faults_in_subprocess(tuned=True) < FAULTS_TUNED


@pytest.mark.slow
@glibc_only
@pytest.mark.timeout(120)
def test_actors_raise_the_thresholds_of_their_workers():
    namespace: dict = {}
    exec(CHURN, namespace)  # a function defined here travels to the workers by value
    churn_faults = namespace["churn_faults"]
    cfg = SlideConfig(hidden=(16,), K=2, L=4, range_pow=6, seed=0)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        (before,) = client.run(churn_faults).values()
        with DistributedTrainer(client, cfg, n_features=50, n_labels=100):
            (after,) = client.run(churn_faults).values()
    assert before > FAULTS_UNTUNED  # the nanny's MALLOC_TRIM_THRESHOLD_ at work
    assert after < FAULTS_TUNED


@pytest.mark.parametrize("nbytes", [0, -1, MMAP_THRESHOLD + 1])
def test_threshold_out_of_range_is_refused(nbytes):
    with pytest.raises(ValueError, match=r"nbytes must be in \(0, 33554432\]"):
        raise_malloc_thresholds(nbytes)

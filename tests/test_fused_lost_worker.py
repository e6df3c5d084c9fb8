"""A fused model's task pinned to a worker that dies fails in one line, never waits on."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from dslide_dask.distributed.fused_build import watched
from dslide_dask.errors import ShardLostError


def _pid() -> int:
    return os.getpid()


@pytest.mark.timeout(180)
def test_a_build_whose_worker_dies_says_so_instead_of_waiting_forever(dask_ports_taken):
    """Killed (as the nanny kills a worker over its memory limit), the worker comes back
    under a new address: without the watch the pinned task waited for the old one."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        client.wait_for_workers(2)
        victim = sorted(client.scheduler_info(n_workers=-1)["workers"])[-1]
        pid = client.run(_pid, workers=[victim])[victim]
        future = client.submit(time.sleep, 600, workers=[victim], pure=False)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ShardLostError, match=f"worker {victim} left the cluster"):
            watched(client, future, (victim,), "building the neighbours, centroids and trees")


def test_a_watched_result_is_the_result(client):
    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    future = client.submit(sum, [1, 2, 3], workers=[worker], pure=False)
    assert watched(client, future, (worker,), "summing") == 6

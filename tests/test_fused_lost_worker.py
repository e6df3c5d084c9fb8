"""A fused model's task pinned to a worker that dies fails in one line, never waits on."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from dslide_dask.distributed.fused_worker import watched
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


class _Unsendable:
    """Stands for a fused model of gigabytes: it must stay on its worker."""

    def __reduce__(self):
        raise RuntimeError("sent to the client")


def _make_unsendable() -> _Unsendable:
    return _Unsendable()


def test_a_built_model_stays_on_its_worker(client):
    """Waiting for a build does not bring its result here (amazon-3m's 300K rows: the
    6 GB model pickled for the client got its worker killed, and the client waited)."""
    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    future = client.submit(_make_unsendable, workers=[worker], pure=False)
    assert watched(client, future, (worker,), "building", fetch=False) is None
    assert future.status == "finished"


def _fails() -> None:
    raise ValueError("a damaged index: neighbours/post_ptr.npy")


def test_what_failed_there_is_raised_here_without_fetching(client):
    future = client.submit(_fails, pure=False)
    with pytest.raises(ValueError, match="post_ptr.npy"):
        watched(client, future, (), "loading", fetch=False)

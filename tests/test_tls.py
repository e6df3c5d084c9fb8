"""Training over TLS (borrowed nodes talk over networks we do not own)."""

import os

import psutil
import pytest
from distributed import Client, LocalCluster
from distributed.security import Security

from dslide_dask import SlideClassifier

#: Slow: two 2-worker clusters, over TLS and TCP (~30 s).
pytestmark = pytest.mark.slow


def _listeners(pids: list[int]) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for pid in pids
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def _family() -> list[int]:
    """This process and its children: the scheduler and nannies run here, workers below."""
    return [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]


def _train(tiny, **cluster_kw) -> tuple[float, set, set, set]:
    """P@1 of a 2-worker fit, and the cluster's comm addresses, HTTP ports and listeners."""
    train, test = tiny
    security = cluster_kw.get("security")
    before = _listeners(_family())  # e.g. the S3 test server of another test module
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",  # not Dask's 8787: another dashboard may hold it
            **cluster_kw,
        ) as cluster,
        Client(cluster, security=security) as client,
    ):
        info = client.scheduler_info()
        comms = {info["address"], *info["workers"]}
        comms |= {w["nanny"] for w in info["workers"].values()}
        http = set(client.run(lambda dask_worker: dask_worker.http_server.port).values())
        http.add(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.http_server.port))
        clf = SlideClassifier(hidden=(64,), epochs=2, seed=0, client=client)
        clf.fit(train.X, train.Y)
        listening = _listeners(_family()) - before
        p1 = clf.score(test.X, test.Y)
        clf.close()
    return p1, comms, http, listening


def test_training_over_tls_learns_as_over_tcp_with_no_plain_listener(tiny):
    p1_tls, comms, http, listening = _train(tiny, security=Security.temporary(), protocol="tls")
    assert comms and all(a.startswith("tls://") for a in comms), comms
    tls_ports = {int(a.rsplit(":", 1)[1]) for a in comms}
    for ip, port in listening:
        # every listener is a TLS comm, or an HTTP endpoint (metrics) on loopback only
        assert port in tls_ports or (port in http and ip == "127.0.0.1"), (ip, port)
    p1_tcp, *_ = _train(tiny)
    assert p1_tls > 0.15 and abs(p1_tls - p1_tcp) <= 0.005, (p1_tls, p1_tcp)

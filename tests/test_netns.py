"""The emulated-cluster tooling (``dslide_workflows.cluster.netns``): namespaces on a
bridge, tc-shaped links, byte counters, cleanup, and Dask running across them.

Everything that builds namespaces needs root, iproute2 and namespace support; those tests
are skipped with the reason :func:`check_available` gives when any is missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dslide_workflows.cluster import netns
from dslide_workflows.cluster.netns import EmulatedCluster, NetnsUnavailable


def _unavailable() -> str | None:
    try:
        netns.check_available()
    except NetnsUnavailable as err:
        return str(err)
    return None


UNAVAILABLE = _unavailable()
needs_netns = pytest.mark.skipif(
    UNAVAILABLE is not None, reason=f"emulated clusters unavailable: {UNAVAILABLE}"
)

PORT = 5001
SERVER = textwrap.dedent(f"""
    import socket, sys
    s = socket.create_server((sys.argv[1], {PORT}))
    print("listening", flush=True)
    c, _ = s.accept()
    n = 0
    while chunk := c.recv(1 << 20):
        n += len(chunk)
    print(n, flush=True)
""")
CLIENT = textwrap.dedent(f"""
    import socket, sys, time
    c = socket.create_connection((sys.argv[1], {PORT}), timeout=20)
    t = time.perf_counter()
    c.sendall(b"x" * int(sys.argv[2]))
    c.shutdown(socket.SHUT_WR)
    c.recv(1)  # the server closes once it has everything
    print(time.perf_counter() - t)
""")


def transfer(net: EmulatedCluster, nbytes: int) -> tuple[float, int]:
    """Send ``nbytes`` over TCP from node 0 to node 1: (seconds, bytes the server got)."""
    src, dst = net.nodes[0], net.nodes[1]
    server = net.popen(dst, [sys.executable, "-c", SERVER, dst.address], stdout=subprocess.PIPE)
    assert server.stdout.readline().strip() == b"listening"
    argv = [sys.executable, "-c", CLIENT, dst.address, str(nbytes)]
    client = subprocess.run(src.command(argv), capture_output=True, timeout=30, check=True)
    got = int(server.stdout.readline())
    net.stop(server)
    server.stdout.close()
    return float(client.stdout), got


def gone(prefix: str) -> bool:
    """No namespace (hence no link: veths live in them) of ``prefix`` is left."""
    return not netns.list_netns(prefix)


# -- no root needed --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("10gbit", 10**10),
        ("1Gbit/s", 10**9),
        ("100mbit", 10**8),
        ("2.5G", 25 * 10**8),
        ("unlimited", None),
        (None, None),
    ],
)
def test_parse_rate(text, bits):
    assert netns.parse_rate(text) == bits


def test_parse_rate_rejects_nonsense():
    with pytest.raises(ValueError, match="link rate"):
        netns.parse_rate("fast")
    assert netns.format_rate(10**9) == "1 Gbit/s"
    assert netns.format_rate(None) == "unlimited"


def test_says_why_when_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetnsUnavailable, match="need root"):
        netns.check_available()


def test_says_why_without_iproute2(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    with pytest.raises(NetnsUnavailable, match="iproute2: ip, tc not found"):
        netns.check_available()


# -- namespaces ------------------------------------------------------------------------------
@needs_netns
def test_nodes_connect_and_counters_count_the_bytes():
    with EmulatedCluster(2) as net:
        names = set(netns.list_netns(net.prefix))
        assert names == {net.prefix + n for n in ("sw", "head", "n0", "n1")}
        assert [n.address for n in net.all_nodes] == ["10.231.0.1", "10.231.0.10", "10.231.0.11"]
        before = net.counters()
        seconds, got = transfer(net, 1_000_000)
        after = net.counters()
        assert got == 1_000_000
        sent = {p: after[p].sent - before[p].sent for p in after}
        received = {p: after[p].received - before[p].received for p in after}
        assert 1_000_000 <= sent["n0"] < 1_100_000  # payload + TCP/IP headers
        assert 1_000_000 <= received["n1"] < 1_100_000
        assert sent["n1"] < 100_000  # ACKs
        assert netns.bytes_sent(before, after) == sum(sent.values())
    assert gone(net.prefix)


@pytest.mark.slow
@needs_netns
def test_links_are_shaped():
    with EmulatedCluster(2, head=False) as net:
        _, unshaped = transfer(net, 2_000_000)
        assert unshaped == 2_000_000
        net.shape("10mbit")
        slow, got = transfer(net, 2_000_000)  # 1.6 s at 10 Mbit/s
        assert got == 2_000_000
        # a rate limit is a lower bound on the time, which a loaded machine only lengthens
        assert slow >= 1.4, f"2 MB at 10 Mbit/s took {slow:.2f} s"
        qdisc = subprocess.run(
            ["tc", "-n", net.nodes[0].netns, "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
        ).stdout
        assert "tbf" in qdisc and "10Mbit" in qdisc
        net.shape(None)
        assert (
            "tbf"
            not in subprocess.run(
                ["tc", "-n", net.switch, "qdisc", "show", "dev", "n0"],
                capture_output=True,
                text=True,
            ).stdout
        )


@needs_netns
def test_nodes_are_pinned_round_robin():
    cpus = sorted(os.sched_getaffinity(0))
    with EmulatedCluster(3, head=True) as net:
        assert net.head_node.cpus is None
        assert [n.cpus for n in net.nodes] == [(cpus[i % len(cpus)],) for i in range(3)]
        code = "import os; print(sorted(os.sched_getaffinity(0)))"
        out = subprocess.run(
            net.nodes[1].command([sys.executable, "-c", code]),
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == str([cpus[1 % len(cpus)]])


@needs_netns
def test_cleanup_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"), EmulatedCluster(2) as net:
        sleeper = net.popen(net.nodes[0], ["sleep", "300"])
        raise RuntimeError("boom")
    assert gone(net.prefix)
    assert sleeper.poll() is not None


# A suite started in the background (``cmd &``, nohup, some CI runners) hands its children
# SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the child restores
# Python's own, so that Ctrl-C means what it means in a terminal whoever started the suite.
CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from dslide_workflows.cluster.netns import EmulatedCluster
    with EmulatedCluster(2, rate="100mbit") as net:
        sleeper = net.popen(net.nodes[1], ["sleep", "300"])
        print(net.prefix, sleeper.pid, flush=True)
        time.sleep(300)
""")


@pytest.mark.slow
@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cleanup_when_interrupted(sig):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        prefix, pid = child.stdout.readline().split()
        assert not gone(prefix)
        child.send_signal(sig)
        assert child.wait(timeout=30) != 0
        assert gone(prefix)
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@needs_netns
def test_namespaces_of_a_killed_run_are_removed():
    probe = subprocess.Popen(["true"])  # its pid is free once it has ended
    probe.wait()
    name = f"{netns.PREFIX}{probe.pid}-0-sw"
    if netns._alive(probe.pid):  # reused already: vanishingly rare
        pytest.skip("pid reused")
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.cleanup_stale()
        assert gone(name)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@needs_netns
def test_delay_needs_netem_or_says_so():
    with EmulatedCluster(1, head=False) as net:
        if netns.netem_available():
            net.shape("1gbit", delay_ms=5)
            out = subprocess.run(
                ["tc", "-n", net.switch, "qdisc", "show", "dev", "n0"],
                capture_output=True,
                text=True,
            ).stdout
            assert "netem" in out and "tbf" in out
        else:
            with pytest.raises(NetnsUnavailable, match="netem"):
                net.shape("1gbit", delay_ms=5)


# -- Dask across namespaces ------------------------------------------------------------------
FIT = textwrap.dedent("""
    import sys
    from distributed import Client
    from dslide_dask import SlideClassifier
    from dslide_dask.data.synthetic import make_synthetic

    train, test = make_synthetic("tiny", seed=0)
    with Client(sys.argv[1], timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
        workers = sorted(w["host"] for w in client.scheduler_info()["workers"].values())
        print("workers", *workers, flush=True)
        clf = SlideClassifier(hidden=(32,), lr=1e-2, epochs=3, client=client)
        clf.fit(train.X, train.Y)
        print("P@1", clf.evaluate(test.X, test.Y)["P@1"], flush=True)
""")


@pytest.mark.slow
@needs_netns
def test_slide_classifier_fits_across_namespaces(tmp_path):
    from dslide_workflows.bench.cluster_runs import child_env, dask_cluster

    with EmulatedCluster(2, rate="1gbit") as net, dask_cluster(net, tmp_path) as scheduler:
        before = net.counters()
        argv = [sys.executable, "-c", FIT, scheduler]
        out = subprocess.run(
            net.head_node.command(argv),
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=150,
        )
        assert out.returncode == 0, out.stderr[-3000:] + (tmp_path / "dask.log").read_text()[-3000:]
        lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
        assert lines["workers"].split() == ["10.231.0.10", "10.231.0.11"]
        assert float(lines["P@1"]) > 0.05
        after = net.counters()
        assert all(after[n].sent > before[n].sent for n in ("head", "n0", "n1"))
    assert gone(net.prefix)

"""An emulated cluster on one Linux machine: network namespaces joined by a bridge.

Layout of one :class:`EmulatedCluster` (all names start ``dsl-<pid>-<k>-``)::

    namespace ...-sw      bridge br0, one port per node (named like the node: head, n0, ...)
    namespace ...-head    eth0 10.231.0.1/24   (optional: the Dask scheduler and client)
    namespace ...-n<i>    eth0 10.231.0.<10+i>/24

Each node is one veth pair (``eth0`` in the node, its port in the switch). A link is
shaped in both directions by a ``tbf`` qdisc on each end (rate), behind a ``netem`` qdisc
when a delay is asked for. Every address is inside these namespaces: the host's own
network is never touched. Processes run in a node with ``ip netns exec``, optionally
pinned to CPUs with ``taskset``. Bytes on the wire are the switch ports' counters.

Needs root, iproute2 (``ip``, ``tc``) and kernel support for network namespaces, veth,
bridges and the tbf qdisc (netem for delays); :func:`check_available` says what is
missing. Cleanup (processes, namespaces and with them the links) runs on leaving the
``with`` block, on SIGINT/SIGTERM/SIGHUP and at interpreter exit; namespaces left by a
killed run (its pid gone) are removed by the next run.

Over 400 lines: setup and cleanup of the namespaces are kept side by side, so that
everything set up is visibly torn down.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dslide_dask.errors import DslideError

PREFIX = "dsl-"
SUBNET = "10.231.0"
IFNAME = "eth0"
BRIDGE = "br0"
#: Signals that clean up before the process ends.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds a process gets to end after SIGTERM before SIGKILL.
TERM_GRACE = 5.0
_RATE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(bit|b|bps)?(/s)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


class NetnsUnavailable(DslideError, RuntimeError):
    """This machine or user cannot build an emulated cluster (why is in the message)."""


# -- rates ----------------------------------------------------------------------------------
def parse_rate(text: str | int | None) -> int | None:
    """Bits per second of ``"10gbit"``, ``"1Gbit/s"``, ``"100M"``...; None for unlimited."""
    if text is None or str(text).strip().lower() in ("unlimited", "none", "inf", "0", ""):
        return None
    if isinstance(text, int):
        return text
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(
            f"link rate must look like 10gbit, 1Gbit/s, 100mbit or unlimited: {text!r}"
        )
    bits = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if bits < 8_000:
        raise ValueError(f"link rate must be at least 8 kbit/s, got {text!r}")
    return int(bits)


def format_rate(bits: int | None) -> str:
    """``"10 Gbit/s"``, ``"100 Mbit/s"``, ``"unlimited"``."""
    if bits is None:
        return "unlimited"
    for unit, scale in (("Tbit/s", 10**12), ("Gbit/s", 10**9), ("Mbit/s", 10**6)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits / 1e3:g} kbit/s"


# -- checks and shell-outs ------------------------------------------------------------------
def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def check_available() -> None:
    """Raise :class:`NetnsUnavailable` unless namespaces, veth and tc can be used here."""
    if os.name != "posix" or not os.path.isdir("/proc/self/ns"):
        raise NetnsUnavailable("emulated clusters need Linux network namespaces")
    if os.geteuid() != 0:
        raise NetnsUnavailable("emulated clusters need root (network namespaces, tc): run as root")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetnsUnavailable(f"emulated clusters need iproute2: {', '.join(missing)} not found")
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            raise NetnsUnavailable(f"'ip netns add' does not work here: {made.stderr.strip()}")
        steps = (
            ["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
            [
                "tc",
                "-n",
                probe,
                "qdisc",
                "add",
                "dev",
                "p0",
                "root",
                "tbf",
                "rate",
                "1mbit",
                "burst",
                "32kb",
                "latency",
                "50ms",
            ],
        )
        for argv in steps:
            proc = _run(argv, check=False)
            if proc.returncode != 0:
                raise NetnsUnavailable(f"'{' '.join(argv[:6])} ...' failed: {proc.stderr.strip()}")
    finally:
        _run(["ip", "netns", "del", probe], check=False)


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (needed for link delays)."""
    probe = f"{PREFIX}{os.getpid()}-netem"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        argv = ["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"]
        return _run(argv, check=False).returncode == 0
    finally:
        _run(["ip", "netns", "del", probe], check=False)


def list_netns(prefix: str = PREFIX) -> list[str]:
    """Names of the network namespaces starting with ``prefix``."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces ``<prefix><pid>-...`` whose creating process is gone; their names."""
    removed = []
    for name in list_netns(prefix):
        pid = name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _kill_netns_pids(name)
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_pids(netns: str) -> None:
    """SIGKILL every process still inside ``netns`` (ours: the namespace is ours)."""
    pids = _run(["ip", "netns", "pids", netns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


# -- counters -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PortBytes:
    """Bytes a node sent into the switch and received from it, from the port's counters."""

    sent: int
    received: int


def read_counters(switch_netns: str) -> dict[str, PortBytes]:
    """Byte counters of every switch port, by port (= node) name. Callable from any
    namespace of the machine (it runs ``ip -n``)."""
    out = _run(["ip", "-n", switch_netns, "-s", "-j", "link", "show"]).stdout
    ports = {}
    for link in json.loads(out):
        if link.get("master") != BRIDGE:
            continue
        stats = link.get("stats64", link.get("stats", {}))
        # the port receives what its node sends, and transmits what the node receives
        ports[link["ifname"]] = PortBytes(stats["rx"]["bytes"], stats["tx"]["bytes"])
    return ports


def bytes_sent(before: dict[str, PortBytes], after: dict[str, PortBytes]) -> int:
    """Bytes all nodes put on the wire between two :func:`read_counters` readings."""
    return sum(after[p].sent - before[p].sent for p in after if p in before)


# -- the cluster ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """One emulated machine: a namespace with one link (``eth0``) to the switch."""

    name: str  # the switch port's name: "head", "n0", "n1", ...
    netns: str
    address: str
    cpus: tuple[int, ...] | None = None

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this node (and pinned to its CPUs)."""
        pin = ["taskset", "-c", ",".join(map(str, self.cpus))] if self.cpus else []
        return ["ip", "netns", "exec", self.netns, *pin, *argv]


_LIVE: set[EmulatedCluster] = set()
_LOCK = threading.Lock()
_counter = iter(range(1 << 30))


@dataclass(eq=False)
class EmulatedCluster:
    """``n_nodes`` namespaces (plus an optional ``head``) on one bridge, links shaped alike.

    Use as a context manager. ``pin=True`` pins node ``i`` to CPU ``i mod #cpus`` (round
    robin over this process's CPUs); the head is not pinned. ``rate`` is bits/s or a
    string for :func:`parse_rate`; None is unlimited; :meth:`shape` changes it later.
    """

    n_nodes: int
    rate: int | str | None = None
    delay_ms: float = 0.0
    head: bool = True
    pin: bool = True
    subnet: str = SUBNET
    nodes: list[Node] = field(default_factory=list, init=False)
    head_node: Node | None = field(default=None, init=False)
    _procs: list[subprocess.Popen] = field(default_factory=list, init=False)
    _saved_handlers: dict = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.n_nodes <= 200:
            raise ValueError(f"n_nodes must be in [1, 200], got {self.n_nodes}")
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_counter)}-"
        self.switch = self.prefix + "sw"
        self._started = False

    # -- building --------------------------------------------------------------------------
    def __enter__(self) -> EmulatedCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> EmulatedCluster:
        """Create the switch, the nodes and their links; shape them."""
        check_available()
        cleanup_stale()
        with _LOCK:
            _LIVE.add(self)
        self._started = True
        self._install_handlers()
        try:
            self._add_netns(self.switch)
            _run(["ip", "-n", self.switch, "link", "add", BRIDGE, "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", BRIDGE, "up"])
            cpus = sorted(os.sched_getaffinity(0))
            if self.head:
                self.head_node = self._add_node("head", f"{self.subnet}.1", None)
            for i in range(self.n_nodes):
                pinned = (cpus[i % len(cpus)],) if self.pin else None
                self.nodes.append(self._add_node(f"n{i}", f"{self.subnet}.{10 + i}", pinned))
            self.shape(self.rate, self.delay_ms)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def all_nodes(self) -> list[Node]:
        return ([self.head_node] if self.head_node else []) + self.nodes

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        off = [f"net.ipv6.conf.{k}.disable_ipv6=1" for k in ("all", "default")]
        _run(["ip", "netns", "exec", name, "sysctl", "-qw", *off], check=False)  # no IPv6 chatter

    def _add_node(self, name: str, address: str, cpus: tuple[int, ...] | None) -> Node:
        netns = self.prefix + name
        self._add_netns(netns)
        _run(
            [
                "ip",
                "link",
                "add",
                name,
                "netns",
                self.switch,
                "type",
                "veth",
                "peer",
                "name",
                IFNAME,
                "netns",
                netns,
            ]
        )
        _run(["ip", "-n", self.switch, "link", "set", name, "master", BRIDGE, "up"])
        _run(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", IFNAME])
        _run(["ip", "-n", netns, "link", "set", IFNAME, "up"])
        return Node(name, netns, address, cpus)

    def shape(self, rate: int | str | None, delay_ms: float = 0.0) -> None:
        """Set every link to ``rate`` (None: unlimited) and one-way ``delay_ms`` per end."""
        bits = parse_rate(rate)
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        if delay_ms and not netem_available():
            raise NetnsUnavailable("link delays need the kernel's netem qdisc (sch_netem)")
        for node in self.all_nodes:
            for netns, dev in ((node.netns, IFNAME), (self.switch, node.name)):
                _set_qdisc(netns, dev, bits, delay_ms)
        self.rate, self.delay_ms = bits, delay_ms

    # -- processes -------------------------------------------------------------------------
    def popen(self, node: Node, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``node`` (own session, ended by :meth:`close`)."""
        proc = subprocess.Popen(node.command(argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace: float = TERM_GRACE) -> None:
        """End one process started by :meth:`popen`: SIGTERM, then SIGKILL after ``grace``."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc in self._procs:
            self._procs.remove(proc)

    def counters(self) -> dict[str, PortBytes]:
        """Byte counters of every node's link (see :func:`read_counters`)."""
        return read_counters(self.switch)

    # -- cleanup ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop our processes, delete our namespaces (and so the links). Idempotent;
        SIGINT/SIGTERM wait until it is done."""
        if not self._started:
            return
        blocked = set(SIGNALS)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            for proc in list(self._procs):
                self.stop(proc, grace=2.0)
            for netns in [n.netns for n in self.all_nodes] + [self.switch]:
                _kill_netns_pids(netns)
            for netns in _run(["ip", "netns", "list"], check=False).stdout.split():
                if netns.startswith(self.prefix):
                    _run(["ip", "netns", "del", netns], check=False)
            self.nodes, self.head_node, self._started = [], None, False
            with _LOCK:
                _LIVE.discard(self)
            self._restore_handlers()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _install_handlers(self) -> None:
        """SIGTERM/SIGHUP end the process through Python (so ``finally`` and ``with`` clean
        up); SIGINT already does, as KeyboardInterrupt."""
        if threading.current_thread() is not threading.main_thread():
            return  # only atexit then
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                self._saved_handlers[sig] = signal.signal(sig, _exit_on_signal)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._saved_handlers.items():
            if signal.getsignal(sig) is _exit_on_signal and not _others_live():
                signal.signal(sig, handler)
        self._saved_handlers = {}


def _set_qdisc(netns: str, dev: str, bits: int | None, delay_ms: float) -> None:
    """Replace the root qdisc of ``dev``: none, tbf, or netem with tbf under it."""
    _run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)
    tbf = []
    if bits is not None:
        burst = max(64 * 1024, bits // 8 // 500)  # >= 2 ms of traffic, >= a GSO packet
        tbf = ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "50ms"]
    if delay_ms:
        netem = ["netem", "delay", f"{delay_ms}ms", "limit", "100000"]
        _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *netem])
        if tbf:
            _run(
                [
                    "tc",
                    "-n",
                    netns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    *tbf,
                ]
            )
    elif tbf:
        _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", *tbf])


def _others_live() -> bool:
    with _LOCK:
        return bool(_LIVE)


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


@atexit.register
def _close_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for cluster in live:
        with contextlib.suppress(Exception):
            cluster.close()


def wait_until(predicate, timeout: float, what: str, every: float = 0.1) -> None:
    """Poll ``predicate()`` until true; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:g} s")
        time.sleep(every)

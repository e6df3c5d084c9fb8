"""Addresses and TLS flags of the command line, checked before anything listens or
connects: Dask takes a dashboard port over 65535 as "in use" and listens on a random one
instead, fails deep inside a cluster's start on a host name that does not resolve, and
a LocalCluster never reads certificate files; each would be silent or a traceback.
Text settings holding a NUL byte are found here too (:func:`nul_setting`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import PurePath

from dslide_workflows.run_schema import TLS_FILES, flag

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?$")
_QUOTE = 60


def check_dashboard_address(value) -> str:
    """``HOST:PORT``, ``:PORT`` (every interface) or ``PORT``, the port in [0, 65535]
    (0: any free one) and the host one this machine can resolve; else a ValueError
    naming ``--dashboard-address``."""
    text = str(value).strip()
    where = f"--dashboard-address {text!r:.{_QUOTE}}"
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isascii() or not port.isdigit():
        raise ValueError(f"{where}: expected HOST:PORT, :PORT or PORT (a port in [0, 65535])")
    _check_port(int(port), where)
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host:
        _check_host(host, where)
    return text


def check_scheduler_address(address: str | None) -> None:
    """A port in an address (``tcp://host:8786``) must be in [1, 65535]; the rest is
    Dask's to parse."""
    if not address:
        return
    rest = str(address).split("://", 1)[-1]
    _, sep, port = rest.rpartition(":")
    if sep and port.isascii() and port.isdigit() and not 1 <= int(port) <= 65535:
        raise ValueError(
            f"--scheduler-address {address!r:.{_QUOTE}}: port {port:.12} is not in [1, 65535]"
        )


def not_a_scheduler(address: str) -> ValueError:
    """The error for an address whose other end answered, but not as a Dask scheduler
    does (its handshake garbage: Dask's reader fails with a ``struct.error`` or a
    ``MemoryError`` for a length read from it)."""
    return ValueError(
        f"--scheduler-address {address}: the other end does not speak Dask's "
        "protocol (not a Dask scheduler's port?)"
    )


def check_tls_files(settings, address: str | None) -> None:
    """Certificate files are for a ``tls://`` scheduler: given for a LocalCluster (which
    takes ``--tls``, with throwaway certificates) or a plain ``tcp://`` one, they would
    be ignored or fail later; refused, naming the flag."""
    given = [flag(name) for name in TLS_FILES if getattr(settings, name, None)]
    if not given:
        return
    if not address:
        raise ValueError(
            f"{given[0]} is for a tls:// --scheduler-address: the LocalCluster started "
            "here takes no certificate files (--tls gives it throwaway ones)"
        )
    if not str(address).startswith("tls://"):
        raise ValueError(
            f"{given[0]} is for a tls:// scheduler, but --scheduler-address "
            f"{address!r:.{_QUOTE}} is not one"
        )


def _check_port(port: int, where: str) -> None:
    if not 0 <= port <= 65535:
        raise ValueError(f"{where}: port {str(port):.12} is not in [0, 65535]")


def _check_host(host: str, where: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not _HOST.match(host):
        raise ValueError(f"{where}: {host!r:.{_QUOTE}} is not a host name or IP address")
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        raise ValueError(f"{where}: unknown host {host!r:.{_QUOTE}}") from None


def nul_setting(settings: dict) -> str | None:
    """The name of the first text setting holding a NUL byte (a flag or a YAML value:
    no path or URL can hold one, and the OS's refusal, "embedded null byte", names no
    file), else None; lists, tuples and mappings are looked into."""

    def has_nul(value) -> bool:
        if isinstance(value, dict):
            return any(has_nul(k) or has_nul(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return any(has_nul(v) for v in value)
        return isinstance(value, str | bytes | PurePath) and "\0" in str(value)

    return next((name for name, value in settings.items() if has_nul(value)), None)

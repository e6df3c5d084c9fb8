"""How the CLI reaches a cluster over networks it does not own: TLS and the dashboard.

``--tls-ca-file``/``--tls-cert``/``--tls-key`` (the names of ``dask worker`` and ``dask
scheduler``) secure the connection to ``--scheduler-address tls://...``; without them a
``tls://`` address takes the certificates of the Dask configuration
(``distributed.comm.tls.*``, e.g. ``DASK_DISTRIBUTED__COMM__TLS__CA_FILE``) or is refused.
``--tls`` gives the CLI's own LocalCluster throwaway certificates
(``Security.temporary()``) and ``tls://`` everywhere. The LocalCluster's dashboard
listens on loopback unless ``--dashboard-address`` says otherwise; where its port is
taken (another Dask dashboard), it moves to a free one, which the CLI prints.

Dask's own voice stays out of a CLI user's terminal unless ``--debug``
(:func:`quiet_dask`): its warnings (a dashboard port taken) and its log lines below ERROR
("Connection ... closed"), in the CLI's process and the workers it starts.

Reaching a scheduler has a deadline (``--connect-timeout``): Dask's client retries a
refused connection until its timeout, and waits for the handshake of a socket that
accepts but never answers without one (:func:`connect_client`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings

from dslide_workflows.endpoints import (
    check_dashboard_address,
    check_scheduler_address,
    check_tls_files,
    not_a_scheduler,
)
from dslide_workflows.run_schema import (
    CONNECT_TIMEOUT,
    LOCAL_DASHBOARD,
    TLS_FILES,
    add_setting_flags,
)
from dslide_workflows.run_schema import flag as setting_flag


def add_security_arguments(group: argparse._ArgumentGroup) -> None:
    """``--tls``, the certificates, ``--dashboard-address`` and ``--connect-timeout``: the
    run settings' own flags (:mod:`dslide_workflows.run_schema`), shared by the commands
    that reach a cluster."""
    add_setting_flags(group, "security")


def connect_client(address: str, security, timeout: float | None, limit: str | None = None):
    """A ``distributed.Client`` of the scheduler at ``address``, or a TimeoutError naming
    it and the timeout once ``timeout`` seconds (None: :data:`CONNECT_TIMEOUT`) have gone;
    ``limit`` names the deadline in that error if it is not ``--connect-timeout``'s.

    A probe first (``distributed.comm.connect`` under ``asyncio.wait_for``): Dask's own
    connect waits for the scheduler's handshake with no deadline, so a socket that
    accepts and stays silent would hang the client. Then the Client, with the same
    timeout for itself and for its connections (``distributed.comm.timeouts.connect``).
    """
    import asyncio

    import dask
    from distributed import Client
    from distributed.comm import connect, parse_address
    from distributed.comm.registry import get_backend

    dask_quiet_now()
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    if not 0 < timeout <= 86400:
        raise ValueError(f"--connect-timeout must be in (0, 86400] seconds, got {timeout:g}")
    args = security.get_connection_args("client") if security is not None else {}

    async def probe():
        comm = await connect(address, timeout=timeout, **args)
        await comm.close()

    limit = limit or f"{timeout:g} s (--connect-timeout)"  # what the error names
    fail = f"--scheduler-address {address}: no answer within {limit}"
    get_backend(parse_address(address)[0])  # a malformed address: Dask's ValueError
    try:
        try:
            asyncio.run(asyncio.wait_for(probe(), timeout))
        except OSError:
            raise
        except Exception as err:  # struct.error, MemoryError...: an answer not Dask's
            raise not_a_scheduler(address) from err
        with dask.config.set({"distributed.comm.timeouts.connect": timeout}):
            return Client(address, security=security, timeout=timeout)
    except OSError:  # TimeoutError too; a refused connection is retried until the timeout
        raise TimeoutError(f"{fail}: refused, unreachable or silent") from None


def client_security(settings, address: str | None):
    """The ``distributed.Security`` for a client of ``address`` (None: plain TCP).

    ``settings`` has ``tls_ca_file``, ``tls_cert`` and ``tls_key`` (flags, run YAML). The
    files are read now, so a missing or broken one is one line naming it.
    """
    from distributed import Security

    check_scheduler_address(address)
    check_tls_files(settings, address)
    files = {setting_flag(name): getattr(settings, name, None) for name in TLS_FILES}
    given = {flag: path for flag, path in files.items() if path}
    if given:
        missing = [flag for flag in files if flag not in given]
        if missing:
            raise ValueError(f"{', '.join(files)} go together: {', '.join(missing)} missing")
        for flag, path in given.items():
            if not os.path.isfile(path):
                raise ValueError(f"{flag} {path}: no such file")
        security = Security(
            tls_ca_file=given["--tls-ca-file"],
            tls_client_cert=given["--tls-cert"],
            tls_client_key=given["--tls-key"],
            require_encryption=True,
        )
    elif address and address.startswith("tls://"):
        security = Security()  # the Dask configuration's certificates, if any
        if not security.tls_ca_file:  # type: ignore[attr-defined]  # set from its config
            raise ValueError(
                f"--scheduler-address {address} needs certificates: --tls-ca-file, "
                "--tls-cert and --tls-key, or the Dask configuration's distributed.comm.tls.*"
            )
    else:
        return None
    try:
        security.get_connection_args("client")  # reads and checks the files
    except (OSError, ValueError) as err:
        files_named = ", ".join(f"{f} {p}" for f, p in files.items() if p) or "the Dask config"
        raise ValueError(f"TLS certificates ({files_named}) cannot be used: {err}") from None
    return security


#: Where Dask's warnings come from (``warnings.warn`` in their modules).
DASK_MODULES = r"(distributed|dask|bokeh|tornado)(\.|$)"
#: The loggers :func:`quiet_dask` contexts quieted, to restore: one list a context.
_QUIETED: list[list[tuple[logging.Logger, int]]] = []


@contextlib.contextmanager
def quiet_dask(debug: bool):
    """Within: Dask's warnings ignored and its log lines below ERROR kept out, unless
    ``debug``. Its loggers' own levels are set (not their handlers', which a LocalCluster
    sets while it runs and restores as it closes, so that lines logged as the client and
    cluster close stay out too), now if Dask is imported, else by :func:`dask_quiet_now`
    where the CLI reaches a cluster (importing Dask sets them); the workers a LocalCluster
    starts log at ERROR as well (:func:`local_cluster_options`)."""
    if debug:
        yield
        return
    quieted: list[tuple[logging.Logger, int]] = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=DASK_MODULES)
        _QUIETED.append(quieted)
        try:
            if "distributed" in sys.modules:
                dask_quiet_now()
            yield
        finally:
            _QUIETED.remove(quieted)
            for logger, level in reversed(quieted):
                logger.setLevel(level)


def dask_quiet_now() -> None:
    """Within :func:`quiet_dask`: Dask's loggers at ERROR, ``distributed`` and those of
    its children Dask's configuration gives a level of their own; outside, nothing."""
    if not _QUIETED:
        return
    names = [n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]
    for name in ["distributed", *names]:
        logger = logging.getLogger(name)
        if (name == "distributed" or logger.level) and logger.level < logging.ERROR:
            _QUIETED[-1].append((logger, logger.level))
            logger.setLevel(logging.ERROR)


def local_cluster_options(settings) -> dict:
    """Keyword arguments for the CLI's LocalCluster: its dashboard, TLS with ``--tls``, and
    its workers' log lines below ERROR kept out within :func:`quiet_dask` (Dask's
    default, WARNING, with ``--debug``)."""
    check_tls_files(settings, None)  # a LocalCluster reads no certificate files
    dashboard = getattr(settings, "dashboard_address", None)
    dask_quiet_now()
    options = {
        "dashboard_address": check_dashboard_address(dashboard or LOCAL_DASHBOARD),
        "silence_logs": logging.ERROR if _QUIETED else logging.WARNING,
    }
    if getattr(settings, "tls", False):
        from distributed import Security

        options.update(security=Security.temporary(), protocol="tls://")
    return options


def add_cluster_arguments(
    p: argparse.ArgumentParser,
    address_default: str = "$DASK_SCHEDULER_ADDRESS, else a new LocalCluster",
    workers_help: str = "LocalCluster workers (default: cores)",
):
    """``--scheduler-address``, ``--workers``, ``--threads-per-worker``, ``--no-progress``
    and the TLS and dashboard flags of a command that runs its work on a cluster."""
    from dslide_workflows.args import positive_int

    p.add_argument(
        "--scheduler-address",
        metavar="ADDR",
        help=f"connect to this scheduler (default: {address_default})",
    )
    p.add_argument("--workers", type=positive_int, metavar="N", help=workers_help)
    p.add_argument("--threads-per-worker", type=positive_int, default=1, metavar="T")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_security_arguments(p.add_argument_group("TLS and dashboard"))


def cli_client(stack, args, address: str | None):
    """The Client of a command's cluster, entered on ``stack``: the scheduler at
    ``address``, else a new LocalCluster of ``--workers`` (its dashboard printed)."""
    from distributed import Client, LocalCluster

    if address:
        security = client_security(args, address)
        client = stack.enter_context(connect_client(address, security, args.connect_timeout))
    else:
        cluster = stack.enter_context(
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=args.threads_per_worker,
                **local_cluster_options(args),
            )
        )
        client = stack.enter_context(Client(cluster))
    print(f"dashboard: {client.dashboard_link}")
    return client

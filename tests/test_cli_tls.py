"""The CLI over networks it does not own: TLS to a scheduler with certificate files, its
own LocalCluster over TLS, its dashboard on loopback, and one line for bad certificates."""

from pathlib import Path

import psutil
import pytest
from distributed import LocalCluster
from distributed.security import Security

from dslide_workflows.security import local_cluster_options, quiet_dask

from .test_cli import assert_usage_error, run

TINY_RUN = ["--preset", "tiny", "--epochs", "1", "--workers", "2", "--eval-points", "200"]
TINY_RUN += ["--no-progress"]


def _cert_files(tmp_path: Path, security: Security) -> list[str]:
    """The throwaway certificate of ``security`` as PEM files, as a cluster's admin hands
    them out: ``--tls-ca-file``, ``--tls-cert``, ``--tls-key``."""
    flags = []
    for flag, pem in (
        ("--tls-ca-file", security.tls_ca_file),
        ("--tls-cert", security.tls_client_cert),
        ("--tls-key", security.tls_client_key),
    ):
        path = tmp_path / (flag.removeprefix("--tls-") + ".pem")
        path.write_text(pem)
        flags += [flag, str(path)]
    return flags


@pytest.mark.slow
def test_train_on_its_own_cluster_over_tls_with_the_dashboard_on_loopback(capsys, tmp_path):
    code, out, err = run(capsys, "train", "--tls", *TINY_RUN, "--run-dir", str(tmp_path / "r"))
    assert code == 0, err
    cluster_line = next(line for line in out.splitlines() if line.startswith("cluster:"))
    assert " at tls://" in cluster_line and "dashboard http://127.0.0.1:" in cluster_line
    assert "P@1" in out


def test_the_local_dashboard_listens_on_loopback_only(dask_ports_taken):
    """On loopback, also where the default port is taken (it moves, as the CLI does)."""

    class Settings:
        tls, dashboard_address = False, None

    with (
        quiet_dask(debug=False),
        LocalCluster(n_workers=1, processes=False, **local_cluster_options(Settings)) as lc,
    ):
        port = lc.scheduler.http_server.port
        listening = {
            c.laddr.ip
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        }
        assert listening == {"127.0.0.1"}, listening


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_train_against_a_tls_scheduler_with_certificate_files(capsys, tmp_path):
    security = Security.temporary()
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address="127.0.0.1:0",  # not Dask's 8787: another dashboard may hold it
        security=security,
        protocol="tls://",
    ) as lc:
        address = lc.scheduler_address
        assert address.startswith("tls://")
        files = _cert_files(tmp_path, security)
        argv = ["train", "--scheduler-address", address, *files, *TINY_RUN]
        code, out, err = run(capsys, *argv, "--run-dir", str(tmp_path / "r"))
        assert code == 0, err
        assert f"cluster: {address}" in out and "P@1" in out
        # a tls:// address without certificates, or with some missing, is one line
        assert_usage_error(
            capsys,
            ["train", "--scheduler-address", address, *TINY_RUN],
            "needs certificates",
            "--tls-ca-file",
        )
        assert_usage_error(
            capsys,
            ["train", "--scheduler-address", address, *files[:2], *TINY_RUN],
            "--tls-cert, --tls-key missing",
        )


def test_a_missing_or_broken_certificate_file_is_one_line_naming_it(capsys, tmp_path):
    files = _cert_files(tmp_path, Security.temporary())
    missing = [*files[:-1], str(tmp_path / "nope.pem")]
    argv = ["train", "--scheduler-address", "tls://127.0.0.1:1", *TINY_RUN]
    assert_usage_error(capsys, [*argv[:3], *missing, *argv[3:]], "--tls-key", "nope.pem")
    (tmp_path / "cert.pem").write_text("not a certificate")
    assert_usage_error(capsys, [*argv[:3], *files, *argv[3:]], "cannot be used", "cert.pem")

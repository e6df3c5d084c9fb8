"""Storage-option secrets, top-level and nested, never appear on stdout, stderr, in any
file of a run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslide_workflows import cli
from dslide_workflows.secrets import mask, scrub
from tests.hostile import FAST, TRAIN

SECRETS = {
    "key": "AKIATOPLEVELKEY1",
    "secret": "tOpLeVeLsEcReT2",
    "token": "sessiontoken3XYZ",
    "client_kwargs.aws_secret_access_key": "nestedSecretAccess4",
    "client_kwargs.aws_session_token": "nestedSessionToken5",
    "config_kwargs.proxies.password": "deepProxyPassword6",
}


def test_mask_walks_any_depth():
    opts = {
        "anon": False,
        "key": "k1",
        "client_kwargs": {"endpoint_url": "http://u:pw9@h/x", "creds": [{"password": "p2"}]},
        "a": {"b": {"my_token": "t3"}},
    }
    masked = mask(opts)
    assert masked == {
        "anon": False,
        "key": "***",
        "client_kwargs": {"endpoint_url": "http://u:***@h/x", "creds": [{"password": "***"}]},
        "a": {"b": {"my_token": "***"}},
    }
    assert scrub("failed: k1 t3 p2 pw9", opts) == "failed: k1 t3 p2 pw9"  # too short to scrub
    long = {"key": "kkk1", "a": {"b_token": "ttt3"}}
    assert scrub("failed with kkk1 and ttt3", long) == "failed with *** and ***"


@pytest.mark.parametrize("in_process", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_secrets_never_leak(tmp_path: Path, capsys, monkeypatch, in_process):
    """A whole run (in process, and on a LocalCluster) with secrets in flags: none on
    stdout, stderr or in run-folder files."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    (tmp_path / "t.txt").write_bytes(TRAIN)
    flags = [a for opt in SECRETS.items() for a in ("--storage-option", "=".join(opt))]
    fast = FAST if in_process else [f for f in FAST if f != "--in-process"] + ["--workers", "1"]
    argv = ["train", *fast, "--train", "t.txt", "--test", "t.txt", "--run-dir", "run"]
    argv += ["--checkpoint-every", "1", *flags]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    # a failing run prints its error line: scrubbed as well
    failing = [*argv[:-2], "--storage-option", "key=" + SECRETS["key"]]
    assert cli.main([*failing, "--train", "nope-" + SECRETS["key"]]) == 2
    out2, err2 = capsys.readouterr()
    texts = [out, err, out2, err2]
    texts += [
        p.read_bytes().decode("latin-1") for p in (tmp_path / "run").rglob("*") if p.is_file()
    ]
    for secret in SECRETS.values():
        for text in texts:
            assert secret not in text
    assert "***" in (tmp_path / "run" / "config.yaml").read_text()


@pytest.mark.slow
def test_secrets_never_reach_the_dashboard(tmp_path: Path, capsys, monkeypatch):
    """Train with secrets on a running cluster, then read everything its dashboard serves
    of the run: the live page's JSON, its Prometheus text and Dask's /metrics."""
    from urllib.parse import urlsplit
    from urllib.request import urlopen

    from distributed import Client, LocalCluster

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_bytes(TRAIN)
    flags = [a for opt in SECRETS.items() for a in ("--storage-option", "=".join(opt))]
    fast = [f for f in FAST if f != "--in-process"]
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        argv = ["train", *fast, "--train", "t.txt", "--test", "t.txt", "--run-dir", "run"]
        argv += ["--scheduler-address", cluster.scheduler_address, *flags]
        assert cli.main(argv) == 0
        capsys.readouterr()
        base = "{0.scheme}://{0.netloc}".format(urlsplit(client.dashboard_link))
        pages = [
            urlopen(f"{base}{path}", timeout=30).read().decode()
            for path in ("/dslide/metrics.json", "/dslide/metrics", "/metrics")
        ]
    assert "dslide_step" in pages[1]  # the run is there
    for secret in SECRETS.values():
        for page in pages:
            assert secret not in page

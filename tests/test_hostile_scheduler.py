"""Hostile input, second round: a scheduler that never answers (a socket that accepts
and stays silent) or refuses. ``dslide train``, ``plan``, ``predict`` and ``leave`` end
within their timeouts (``--connect-timeout``, ``leave --timeout``) in one line ``dslide:
error: ...`` (exit 2) naming the address and the timeout; the timeouts' range is checked.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from dslide_workflows import cli
from tests.hostile import FAST, one_error, work_folder

ON_CLUSTER = [f for f in FAST if f != "--in-process"]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory, holding a small training file t.txt."""
    return work_folder(tmp_path, monkeypatch)


# -- 6. a scheduler that never answers ---------------------------------------------------------
@pytest.fixture
def silent_scheduler():
    """A socket on 127.0.0.1 that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def _refused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"  # closed once returned: refused


@pytest.mark.timeout(60)
def test_train_against_a_silent_scheduler(capsys, work, silent_scheduler):
    t0 = time.monotonic()
    argv = ["train", *ON_CLUSTER, "--train", "t.txt", "--run-dir", "run"]
    argv += ["--scheduler-address", silent_scheduler, "--connect-timeout", "1"]
    one_error(
        capsys,
        argv,
        f"--scheduler-address {silent_scheduler}: no answer within 1 s (--connect-timeout)",
    )
    assert time.monotonic() - t0 < 15


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_plan_against_a_silent_scheduler(capsys, work, silent_scheduler):
    (work / "c.yaml").write_bytes(b"connect_timeout: 1.5\n")
    one_error(
        capsys,
        ["plan", "--train", "t.txt", "--config", "c.yaml", "--scheduler-address", silent_scheduler],
        silent_scheduler,
        "within 1.5 s (--connect-timeout)",
    )


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_predict_against_a_silent_scheduler(capsys, work, silent_scheduler):
    assert cli.main(["train", *FAST, "--train", "t.txt", "--run-dir", "run"]) == 0
    capsys.readouterr()
    t0 = time.monotonic()
    argv = ["predict", "run", "t.txt", "out", "--no-progress"]
    argv += ["--scheduler-address", silent_scheduler, "--connect-timeout", "1"]
    one_error(capsys, argv, silent_scheduler, "within 1 s (--connect-timeout)")
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [pytest.param("silent", marks=pytest.mark.slow), "refused"])
def test_leave_ends_within_its_timeout(capsys, work, silent_scheduler, kind):
    address = silent_scheduler if kind == "silent" else _refused_address()
    t0 = time.monotonic()
    one_error(
        capsys,
        ["leave", "--scheduler-address", address, "--worker", "w", "--timeout", "2"],
        address,
        "within 2 s (--timeout)",
    )
    assert time.monotonic() - t0 < 2 + 3


def test_connect_timeout_default_and_range(capsys, work):
    from dslide_workflows.security import CONNECT_TIMEOUT

    assert CONNECT_TIMEOUT <= 20  # train, predict and leave end within 30 s by default
    (work / "c.yaml").write_bytes(b"connect_timeout: -1\n")
    argv = ["train", *ON_CLUSTER, "--train", "t.txt", "--config", "c.yaml"]
    argv += ["--scheduler-address", "tcp://127.0.0.1:1"]
    one_error(capsys, argv, "c.yaml: connect_timeout must be a number in")
    argv = ["leave", "--scheduler-address", "tcp://127.0.0.1:1", "--worker", "w"]
    argv += ["--connect-timeout", "0"]
    one_error(capsys, argv, "--connect-timeout must be in (0, 86400]")

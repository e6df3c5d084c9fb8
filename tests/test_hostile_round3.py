"""Hostile input, third round (issue 53): secrets in what the library raises and logs,
configs read to a bound, a port that answers garbage, an unchecked candidate count, and
an unwritable output folder found before a cluster starts. Each ends in one line
``dslide: error: ...`` naming the file, flag or address, exit 2 (``tests/hostile.py``).
"""

from __future__ import annotations

import errno
import functools
import http.server
import os
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from dslide_workflows import cli
from tests.hostile import FAST, one_error, trained_run_folder, work_folder

#: A data file whose third point (line 4) is bad.
BAD = b"3 20 5\n0 1:1\n1 2:1\n1 x:1\n"
SECRETS = ("SECRETPW", "TOKSECRET")


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory, holding a small training file t.txt."""
    return work_folder(tmp_path, monkeypatch)


@pytest.fixture
def served(tmp_path: Path):
    """An HTTP server of ``tmp_path`` on 127.0.0.1 (user names and queries ignored): its
    port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


# -- secrets -------------------------------------------------------------------------------
def test_a_bad_line_of_a_secret_url_keeps_its_line_number(capsys, work):
    """The CLI's line masks the token and still says which line is bad."""
    (work / "b.txt?token=TOKSECRET").write_bytes(BAD)
    line, _ = one_error(capsys, ["train", *FAST, "--train", "b.txt?token=TOKSECRET"])
    _clean(line)
    assert "b.txt?token=***:4: feature id 'x'" in line


def test_the_apis_errors_name_no_credentials(tmp_path, served):
    """What the Python API raises about a URL (a bad line, a missing file, a storage
    library's error) shows the URL without its password or token, and keeps its type."""
    pytest.importorskip("aiohttp")
    from dslide_dask.data import read_xc
    from dslide_dask.data.source import open_source, read_dataset
    from dslide_dask.errors import XCFormatError

    (tmp_path / "bad.txt").write_bytes(BAD)
    base = f"http://u:SECRETPW@127.0.0.1:{served}"
    for read in (read_xc, read_dataset):
        with pytest.raises(XCFormatError) as err:
            read(f"{base}/bad.txt?token=TOKSECRET")
        _clean(str(err.value) + err.value.source + repr(err.value))
        assert str(err.value).endswith("/bad.txt?token=***:4: feature id 'x' is not a "
                                       "non-negative integer")  # fmt: skip
    with pytest.raises(OSError) as missing:  # fsspec's, which names the URL
        read_xc(f"{base}/none.txt?token=TOKSECRET")
    _clean(str(missing.value))
    with pytest.raises(FileNotFoundError) as missing:
        open_source(f"{base}/none.txt?token=TOKSECRET")
    _clean(str(missing.value))


@pytest.mark.timeout(180)
def test_a_workers_log_names_no_credentials(tmp_path, served, client):
    """A bad data file read by a task on a worker: Dask logs the error with its message
    there; neither that log nor the error the client gets shows the secrets."""
    pytest.importorskip("aiohttp")
    from dslide_dask.data.source import open_source, read_partition
    from dslide_dask.errors import XCFormatError

    (tmp_path / "bad.txt").write_bytes(BAD)
    src = open_source(f"http://u:SECRETPW@127.0.0.1:{served}/bad.txt?token=TOKSECRET")
    future = client.submit(read_partition, src.partitions[0], pure=False)
    with pytest.raises(XCFormatError, match=r"bad\.txt\?token=\*\*\*:4: feature id") as err:
        future.result()
    _clean(str(err.value))
    logs = str(client.get_worker_logs())
    assert "Compute Failed" in logs and "bad.txt?token=***" in logs
    _clean(logs)


def test_debug_tracebacks_name_no_credentials(capsys, work, monkeypatch):
    """--debug re-raises (a bug report's traceback) and what Python then prints of it
    shows no secret: neither the URL's token nor a storage option's value."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    (work / "b.txt?token=TOKSECRET").write_bytes(BAD)
    argv = ["--debug", "train", *FAST, "--train", "b.txt?token=TOKSECRET"]
    with pytest.raises(ValueError) as err:
        cli.main([*argv, "--storage-option", "password=SECRETPW"])
    capsys.readouterr()
    sys.excepthook(err.type, err.value, err.tb)
    shown = capsys.readouterr().err
    assert "Traceback" in shown and "b.txt?token=***:4:" in shown
    _clean(shown)


# -- configs -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["device", "fifo", "big", "folder"])
def test_config_is_read_to_a_bound(capsys, work, kind):
    """--config /dev/zero, a FIFO, a folder or a file over 1 MiB (a valid one: a long
    comment): one line naming it, before anything is read past the bound."""
    if kind == "device":
        config = "/dev/zero"
    elif kind == "fifo":
        config = str(work / "c.fifo")
        os.mkfifo(config)
    elif kind == "big":
        config = str(work / "c.yaml")
        Path(config).write_bytes(b"epochs: 1\n#" + b"x" * (2 << 20) + b"\n")
    else:
        config = str(work)
    before = sorted(os.listdir(work))  # (a snapshot would read the FIFO)
    one_error(capsys, ["train", *FAST, "--train", "t.txt", "--config", config], config)
    assert sorted(os.listdir(work)) == before


def test_a_config_within_the_bound_is_read(capsys, work):
    (work / "c.yaml").write_bytes(b"epochs: 1\n#" + b"x" * (1 << 19) + b"\n")
    argv = ["train", *FAST, "--train", "t.txt", "--config", "c.yaml", "--run-dir", "run"]
    assert cli.main(argv) == 0


# -- a port that answers garbage -----------------------------------------------------------
@pytest.fixture
def garbage_port():
    """A port that answers every connection with 16 bytes (a frame count of 1 and a
    length of 8 GiB) and then stays silent."""
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.sendall(struct.pack("<QQ", 1, 1 << 33))
            conns.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in conns:
        conn.close()
    listener.close()


@pytest.mark.timeout(120)
def test_a_port_answering_garbage_is_named(capsys, work, garbage_port):
    address = f"tcp://127.0.0.1:{garbage_port}"
    argv = ["train", *FAST[1:], "--train", "t.txt", "--run-dir", "run"]
    argv += ["--scheduler-address", address, "--connect-timeout", "10"]
    line, _ = one_error(capsys, argv, address, "does not speak Dask's protocol")
    assert "internal error" not in line


# -- predict --index ----------------------------------------------------------------------
def test_index_candidates_are_bounded(capsys, work):
    """--candidates past the output index's 65,536 (the index's own bound): one line,
    before the model is read; the API's PredictSpec says the same."""
    from dslide_dask.inference.spec import PredictSpec

    argv = ["predict", "nowhere", "t.txt", "out", "--index", "--candidates", "300000"]
    one_error(capsys, argv, "--candidates must be in [0, 65536] with --index", "300000")
    with pytest.raises(ValueError, match=r"candidates must be in \[0, 65536\]"):
        PredictSpec("m", exact=False, output_index=True, candidates=300_000)
    PredictSpec("m", exact=False, output_index=True, candidates=65_536)
    PredictSpec("m", exact=False, candidates=300_000)  # LSH: all found, whatever asked


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> Path:
    """A trained run folder whose model has an output index."""
    run = trained_run_folder(tmp_path_factory.mktemp("round3-indexed"))
    assert cli.main(["index", str(run)]) == 0
    return run


@pytest.mark.timeout(120)
def test_predict_into_a_read_only_folder_starts_no_cluster(capfd, work, indexed, monkeypatch):
    """OUT on a read-only file system: one line naming it, before a cluster starts
    (each task failed, printing a worker's traceback, then the error came)."""
    import distributed
    from fsspec.implementations.local import LocalFileSystem

    out = str(work / "ro" / "out")
    (work / "ro").mkdir()

    def read_only(real):
        def refuse(self, path, *args, **kwargs):
            if str(path).startswith(str(work / "ro")):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real(self, path, *args, **kwargs)

        return refuse

    for name in ("_open", "makedirs", "mkdir", "touch", "pipe_file"):
        monkeypatch.setattr(LocalFileSystem, name, read_only(getattr(LocalFileSystem, name)))

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster started")

    monkeypatch.setattr(distributed, "LocalCluster", no_cluster)
    argv = ["predict", str(indexed), "t.txt", out, "--index", "--no-progress"]
    assert cli.main(argv) == 2
    err = capfd.readouterr().err
    assert err.strip().splitlines() == [f"dslide: error: {out}: read-only file system"], err
    assert os.listdir(work / "ro") == []


def test_predict_output_probe_leaves_nothing(work):
    """The writable check leaves no probe file, nor a folder it made for it."""
    from dslide_dask.inference.output import check_output

    check_output(str(work / "new" / "out"), 2, {})
    assert not (work / "new").exists()
    (work / "old").mkdir()
    check_output(str(work / "old"), 2, {})
    assert os.listdir(work / "old") == []

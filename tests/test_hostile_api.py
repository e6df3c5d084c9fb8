"""Hostile input, second round: the Python API refuses what the text reader refuses (ids
that do not fit 32 bits, matrices wider than the supported 2**31 - 1 columns, a column
twice in a row), before anything is sized by it; and more of the command line's failures
end as exit 2 and one line ``dslide: error:`` of at most 300 characters naming the file
or the parameter (deep or mistyped JSON, damaged checkpoints and archives, addresses,
TLS flags, NUL bytes), where they were a traceback, exit 1 or a silent misreading.
"""

from __future__ import annotations

import bz2
import gzip
import json
import shutil
import socket
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dslide_dask import CSR, SlideClassifier
from dslide_dask.checkpoint.arrays import write_array
from dslide_dask.data.csr import as_csr
from dslide_workflows import cli
from tests.hostile import FAST, TRAIN, fails_cleanly, trained_run, trained_run_folder, work_folders

BIG = 2**33 + 7  # wraps to 7 in 32 bits


def _scipy(ids, shape, dtype=np.int64):
    ids = np.asarray(ids, dtype)
    return sp.csr_matrix((np.ones(len(ids)), ids, np.arange(len(ids) + 1)), shape=shape)


def _fit(X, Y):
    return SlideClassifier(hidden=(8,), epochs=1, client=False).fit(X, Y)


# -- 7: the Python API -----------------------------------------------------------------------
API_CASES = [
    ("X-id-wraps", _scipy([BIG, 1], (2, 20)), [0, 1], "X row 0 has column id 8589934599"),
    (
        "X-too-wide",
        _scipy([7, 1], (2, 2**34)),
        [0, 1],
        "X has 17,179,869,184 columns, more than the 2,147,483,647 (2**31 - 1) supported",
    ),
    (
        "X-repeat",
        sp.csr_matrix((np.ones(3), [1, 3, 3], [0, 1, 3]), shape=(2, 5)),
        [0, 1],
        "X row 1 holds column 3 more than once",
    ),
    ("Y-id-wraps", _scipy([0, 1], (2, 5)), _scipy([BIG, 1], (2, 9)), "Y row 0 has column id"),
    ("Y-too-wide", _scipy([0, 1], (2, 5)), _scipy([3, 1], (2, 2**34)), "Y has 17,179,869,184"),
    (
        "Y-repeat",
        _scipy([0, 1], (2, 5)),
        sp.csr_matrix((np.ones(3), [2, 2, 1], [0, 2, 3]), shape=(2, 4)),
        "Y row 0 holds column 2 more than once",
    ),
    (
        "X-CSR-unsorted-repeat",
        CSR([0, 3, 4], [4, 1, 4, 0], np.ones(4), 5),
        [0, 1],
        "X row 0 holds column 4 more than once",
    ),
]


@pytest.mark.parametrize("X,Y,expected", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_fit_refuses_what_the_text_reader_refuses(X, Y, expected):
    with pytest.raises(ValueError) as err:
        _fit(X, Y)
    assert expected in str(err.value)


def test_ids_past_32_bits_never_wrap():
    with pytest.raises(ValueError, match="does not fit 32 bits"):
        CSR([0, 1], np.array([BIG]), None, 20)
    with pytest.raises(ValueError, match="CSR n_cols must be in"):
        CSR([0, 1], np.array([7]), None, 2**34)
    with pytest.raises(ValueError, match="X row 0 has column id -1"):
        as_csr(_scipy([-1, 1], (2, 5)), name="X")


def test_a_wide_sparse_array_is_refused_before_conversion():
    import sparse

    coo = sparse.COO(np.array([[0], [2**40]]), [1.0], shape=(2, 2**41))
    with pytest.raises(ValueError, match="X has 2,199,023,255,552 columns"):
        as_csr(coo, name="X")
    tall = sparse.COO(np.array([[2**50], [1]]), [1.0], shape=(2**50 + 1, 5))
    with pytest.raises(ValueError, match=r"X \(1,125,899,906,842,625 rows\) needs"):
        as_csr(tall, name="X")


def test_a_model_too_big_for_memory_is_refused_before_allocation(monkeypatch):
    """2**31 - 1 columns fit the ids but not this machine: the model's size is checked
    against the free memory first (it was allocated, then the process killed)."""
    from dslide_dask import memory
    from dslide_dask.model import network

    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 30)
    monkeypatch.setattr(network.SlideNetwork, "__init__", _never)
    with pytest.raises(ValueError, match="a model of 2,147,483,647 features and 2 labels"):
        _fit(_scipy([7, 1], (2, 2**31 - 1)), [0, 1])


def _never(*args, **kwargs):
    raise AssertionError("the model was built before its size was checked")


def test_predict_refuses_repeated_columns():
    X = sp.random(40, 20, density=0.3, format="csr", random_state=0)
    clf = _fit(X, np.arange(40) % 3)
    bad = sp.csr_matrix((np.ones(2), [5, 5], [0, 2]), shape=(1, 20))
    with pytest.raises(ValueError, match="X row 0 holds column 5 more than once"):
        clf.predict_topk(bad, k=2)


# -- 8 and 9: the command line --------------------------------------------------------------
@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    inputs, run = work_folders(tmp_path, monkeypatch)
    (inputs / "t.txt").write_bytes(TRAIN)
    return inputs, run


def _zst_cut() -> bytes:
    import zstandard

    whole = zstandard.ZstdCompressor().compress(TRAIN * 400)
    return whole[: len(whole) // 2]


def _zip_of(*names: str) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name in names:
            archive.writestr(name, TRAIN)
    return buf.getvalue()


def _converted(inputs: Path, change) -> Path:
    assert cli.main(["convert", str(inputs / "t.txt"), str(inputs / "conv")]) == 0
    manifest = inputs / "conv" / "manifest.json"
    manifest.write_text(change(json.loads(manifest.read_text())))
    return inputs / "conv"


def _points_2_63(meta: dict) -> str:
    meta["n_points"] = meta["chunks"][0]["n_points"] = 2**63
    return json.dumps(meta)


FILE_CASES = [
    ("zst-cut", "t.txt.zst", _zst_cut, "t.txt.zst: truncated zstd stream"),
    (
        "zip-two",
        "t.zip",
        lambda: _zip_of("a.txt", "b.txt"),
        "t.zip: a zip archive of 2 files ('a.txt', 'b.txt')",
    ),
    (
        "points-2^63-gz",
        "p.txt.gz",
        lambda: gzip.compress(TRAIN.replace(b"6 20 5", b"9223372036854775808 20 5")),
        "p.txt.gz:1: header N_points 9223372036854775808 exceeds the supported 1,099,511,627,776",
    ),
    (
        "points-2^63-bz2",
        "p.txt.bz2",
        lambda: bz2.compress(TRAIN.replace(b"6 20 5", b"9223372036854775807 20 5")),
        "exceeds the supported",
    ),
    (
        "feature-id-1MB",
        "t.txt",
        lambda: TRAIN.replace(b"19:1", b"9" * 1_000_000 + b":1"),
        "t.txt:6: feature id 999999999999999999999999... (1,000,000 digits) >= n_features 20",
    ),
    (
        "negative-label-1MB",
        "t.txt",
        lambda: TRAIN.replace(b"4 6:1", b"-" + b"4" * 10**6 + b" 6:1"),
        "t.txt:5: negative label id -44444",
    ),
]


@pytest.mark.parametrize(
    "name,make,expected", [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES]
)
def test_bad_files_are_one_short_line(capsys, work, name, make, expected):
    inputs, run = work
    (inputs / name).write_bytes(make())
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / name)]
    line = fails_cleanly(capsys, argv, expected, inputs.parent, run)
    assert len(line) <= cli.MAX_LINE


@pytest.mark.parametrize(
    "change,expected",
    [
        (_points_2_63, "manifest.json: n_points must be an integer <= 1099511627776 (the supp"),
        (
            lambda m: "[" * 100_000 + "]" * 100_000,
            "manifest.json: not valid JSON (nested too deeply)",
        ),
    ],
    ids=["points-2^63", "deep"],
)
def test_damaged_converted_manifests(capsys, work, change, expected):
    inputs, run = work
    folder = _converted(inputs, change)
    capsys.readouterr()
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(folder)]
    fails_cleanly(capsys, argv, expected, inputs.parent, run)


def test_a_file_named_like_a_glob_is_read(capsys, work):
    inputs, run = work
    shutil.copy(inputs / "t.txt", inputs / "train[2020].txt")
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / "train[2020].txt")]
    assert cli.main(argv) == 0, capsys.readouterr().err


def test_nul_bytes_are_named(capsys, work):
    inputs, run = work
    argv = ["train", *FAST, "--run-dir", str(run), "--train", f"{inputs}/t\0.txt"]
    fails_cleanly(capsys, argv, "argument --train: holds a NUL byte", inputs.parent, run)
    (inputs / "c.yaml").write_text('train: "x\\0y.txt"\n')
    argv = ["train", *FAST, "--run-dir", str(run), "--config", str(inputs / "c.yaml")]
    fails_cleanly(capsys, argv, "train holds a NUL byte", inputs.parent, run)


FLAG_CASES = [
    (["--dashboard-address", "evil"], "--dashboard-address 'evil': expected HOST:PORT"),
    (["--dashboard-address", "127.0.0.1:70000"], "port 70000 is not in [0, 65535]"),
    (["--dashboard-address", "no-such-host.invalid:1"], "unknown host 'no-such-host.invalid'"),
    (["--tls-cert", "/etc/hostname"], "--tls-cert is for a tls:// --scheduler-address"),
    (["--tls", "--tls-ca-file", "ca.pem"], "--tls-ca-file is for a tls:// --scheduler-address"),
    (
        ["--scheduler-address", "tcp://127.0.0.1:8786", "--tls-key", "k.pem"],
        "--tls-key is for a tls:// scheduler, but --scheduler-address",
    ),
    (["--scheduler-address", "tcp://127.0.0.1:70000"], "port 70000 is not in [1, 65535]"),
]


@pytest.mark.parametrize("flags,expected", FLAG_CASES, ids=[c[0][-1] for c in FLAG_CASES])
def test_cluster_flags_are_checked_before_a_cluster_starts(capsys, work, flags, expected):
    inputs, run = work
    fast = [f for f in FAST if f != "--in-process"]
    argv = ["train", *fast, "--workers", "1", "--run-dir", str(run)]
    argv += ["--train", str(inputs / "t.txt"), *flags]
    fails_cleanly(capsys, argv, expected, inputs.parent, run)


def test_an_endpoint_that_is_not_a_scheduler(capsys, work):
    """An HTTP server's reply read as Dask's frame lengths asked for exabytes: "out of
    memory" before; now the address is named."""
    inputs, run = work
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000)

    threading.Thread(target=serve, daemon=True).start()
    try:
        fast = [f for f in FAST if f != "--in-process"]
        argv = ["train", *fast, "--run-dir", str(run), "--train", str(inputs / "t.txt")]
        argv += ["--scheduler-address", f"tcp://127.0.0.1:{port}"]
        expected = f"tcp://127.0.0.1:{port}: the other end does not speak Dask's protocol"
        fails_cleanly(capsys, argv, expected, inputs.parent, run)
    finally:
        server.close()


# -- run folders and checkpoints ------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return trained_run_folder(tmp_path_factory.mktemp("finished-api"))


def _metrics(text: str):
    return lambda run: (run / "metrics.jsonl").write_text(text + "\n")


def _zero_d_bias(run: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("file")
    for d in ("checkpoints", "model"):
        folder = run / d / (run / d / "LATEST").read_text().strip()
        entry = write_array(fs, str(folder / "shard-0000" / "bias.npy"), np.float32(0.5))
        meta = json.loads((folder / "meta.json").read_text())
        meta["arrays"]["shard-0000/bias"] = entry
        (folder / "meta.json").write_text(json.dumps(meta))


RUN_CASES = [
    (
        "metrics-deep",
        _metrics("[" * 100_000 + "]" * 100_000),
        "metrics.jsonl:1: not a metrics record (nested too deeply)",
    ),
    ("metrics-number", _metrics("5"), "metrics.jsonl:1: expected a JSON object, got int"),
    (
        "metrics-step-text",
        _metrics('{"kind": "step", "step": "x", "loss": 1}'),
        "metrics.jsonl:1: step must be a non-negative integer, got 'x'",
    ),
    (
        "metrics-no-loss",
        _metrics('{"kind": "step", "step": 1}'),
        "metrics.jsonl:1: loss must be a number, got None",
    ),
    (
        "metrics-score-text",
        _metrics('{"kind": "eval", "step": 1, "P@1": "x"}'),
        "metrics.jsonl:1: P@1 must be a number, got 'x'",
    ),
    ("metrics-kind", _metrics('{"kind": 7, "step": 1}'), "metrics.jsonl:1: kind must be one of"),
    ("bias-0d", _zero_d_bias, "array 'shard-0000/bias' has shape [], expected [5]"),
]


@pytest.mark.parametrize(
    "damage,expected", [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES]
)
@pytest.mark.parametrize("command", ["resume", "report"])
def test_damaged_run_folders(capsys, work, finished, damage, expected, command):
    inputs, run = work
    trained_run(run, finished)
    damage(run)
    if command == "resume":
        argv = ["train", "--resume", str(run), "--epochs", "3", "--in-process", "--no-progress"]
    elif "metrics" in expected:
        argv = ["report", str(run), "--plot", str(inputs / "c.png")]
    else:  # the model is read by predict, not by report
        argv = ["predict", str(run), str(inputs / "t.txt"), str(inputs / "out"), "--workers", "1"]
    fails_cleanly(capsys, argv, expected, inputs.parent, run)


def test_predictions_manifest_nested_deeply(tmp_path):
    from dslide_dask.inference.output import read_predictions

    (tmp_path / "predictions.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="not valid JSON \\(nested too deeply\\)"):
        read_predictions(str(tmp_path))


@pytest.mark.timeout(180)
def test_predict_into_an_existing_file_starts_no_task(capfd, work, finished):
    """OUT an existing file: refused before a task runs (each printed a worker's
    traceback, then the error)."""
    inputs, _ = work
    (inputs / "out").write_text("keep\n")
    argv = ["predict", str(finished), str(inputs / "t.txt"), str(inputs / "out")]
    argv += ["--workers", "1", "--no-progress"]
    assert cli.main(argv) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Compute Failed" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"dslide: error: {inputs / 'out'}: a file exists there: the predictions go into a folder"
    )
    assert (inputs / "out").read_text() == "keep\n"


def test_error_lines_are_capped(capsys, monkeypatch):
    from dslide_workflows import report

    def long(args):
        raise ValueError("x" * 5000)

    monkeypatch.setattr(report, "cmd_report", long)  # the parser is built on each call
    assert cli.main(["report", "somewhere"]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line) == cli.MAX_LINE and " ... " in line and line.endswith("xxx")

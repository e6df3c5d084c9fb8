"""Hostile folders: symbolic links, FIFOs and ``/dev/zero`` where dslide reads or writes,
a folder of other files given as ``--run-dir``, two runs on one folder, and SIGTERM.

Every refusal is exit 2 and one line ``dslide: error:`` naming the file or the
parameter, and changes nothing anywhere: the victim files outside are the same byte for
byte, the run folder keeps every checkpoint (``dslide_dask.paths`` decides every local
path; ``dslide_workflows.run_lock`` holds a run folder for one run).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dslide_dask.inference.output import read_predictions, write_manifest, write_part
from dslide_dask.paths import OutsideError
from dslide_workflows import cli
from dslide_workflows.run_folder import RunFolder
from dslide_workflows.run_lock import LOCK, RunLock
from tests.hostile import FAST, TRAIN, trained_run, trained_run_folder

SECRET = b"SECRET-TOKEN-8f2c\n"
RESUME = ["--epochs", "3", "--in-process", "--no-progress", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run folder trained for one epoch with a checkpoint every step."""
    return trained_run_folder(tmp_path_factory.mktemp("finished"))


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/cwd as working directory, with victims beside it: a file, a secret and a
    folder D holding a precious (uncommitted-looking) checkpoint folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("DSLIDE_DEBUG", raising=False)
    (tmp_path / "victim").write_bytes(b"precious notes\n")
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "D" / "step-00000000-precious").mkdir(parents=True)
    (tmp_path / "D" / "step-00000000-precious" / "keep.bin").write_bytes(b"\x00keep")
    (tmp_path / "t.txt").write_bytes(TRAIN)
    return tmp_path


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a digest of a file's bytes, a link's target, or its
    kind (a FIFO is never opened: reading it would wait for a writer)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                what = "link:" + os.readlink(path)
            elif stat.S_ISREG(mode):
                what = hashlib.sha1(path.read_bytes()).hexdigest()
            else:
                what = f"mode:{stat.S_IFMT(mode)}"
            out[str(path.relative_to(root))] = what
    return out


def refused(capsys, argv: list[str], expected: str, root: Path) -> str:
    """``dslide argv`` ends with exit 2 and one line holding ``expected``, without a
    secret printed, and nothing under ``root`` changed."""
    before = snapshot(root)
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("dslide: error: ") and expected in lines[0], lines[0]
    assert len(lines[0]) <= 300, lines[0]
    assert SECRET.decode().strip() not in out + err
    assert snapshot(root) == before
    return lines[0]


def _link(name: str, target: str):
    def damage(run: Path, box: Path) -> None:
        path = run / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.symlink_to(target if target.startswith("/") else box / target)

    return damage


def _checkpoints_to_d(name: str):
    """``RUN/name`` a link to D, which holds a copy of the run's checkpoints too."""

    def damage(run: Path, box: Path) -> None:
        shutil.copytree(run / name, box / "D", dirs_exist_ok=True)
        _link(name, "D")(run, box)

    return damage


def _array_link(run: Path, box: Path) -> None:
    latest = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text()
    shutil.copy(latest / "hidden" / "W0.npy", box / "victim")
    _link(f"checkpoints/{latest.name}/hidden/W0.npy", "victim")(run, box)


def _fifo(name: str):
    def damage(run: Path, box: Path) -> None:
        (run / name).unlink()
        os.mkfifo(run / name)

    return damage


def _huge_latest(run: Path, box: Path) -> None:
    for d in ("checkpoints", "model"):
        (run / d / "LATEST").write_bytes(b"a" * (1 << 20))


RESUME_CASES = [
    ("summary-json", _link("summary.json", "victim"), "summary.json: a symbolic link"),
    ("summary-txt", _link("summary.txt", "victim"), "summary.txt: a symbolic link"),
    ("metrics", _link("metrics.jsonl", "victim"), "metrics.jsonl: a symbolic link"),
    ("curves", _link("curves.png", "victim"), "curves.png: a symbolic link"),
    ("checkpoints-dir", _checkpoints_to_d("checkpoints"), "run/checkpoints: a symbolic link"),
    ("model-dir", _checkpoints_to_d("model"), "run/model: a symbolic link"),
    ("array", _array_link, "W0.npy: a symbolic link"),
    ("latest-dev-zero", _link("checkpoints/LATEST", "/dev/zero"), "LATEST: a symbolic link"),
    ("config-dev-zero", _link("config.yaml", "/dev/zero"), "config.yaml: a symbolic link out"),
    ("config-secret", _link("config.yaml", "secret"), "config.yaml: a symbolic link out"),
    ("config-fifo", _fifo("config.yaml"), "config.yaml: not a regular file"),
    ("latest-huge", _huge_latest, "LATEST: more than 4096 bytes, too big"),
    ("lock-link", _link(LOCK, "victim"), "run.lock: a symbolic link"),
]


@pytest.mark.parametrize(
    "damage,expected", [c[1:] for c in RESUME_CASES], ids=[c[0] for c in RESUME_CASES]
)
def test_resume_follows_no_link(capsys, box, finished, damage, expected):
    run = trained_run(box / "run", finished)
    damage(run, box)
    refused(capsys, ["train", "--resume", run, *RESUME], expected, box)


REPORT_CASES = [
    ("curves", _link("curves.png", "victim"), "curves.png: a symbolic link"),
    ("summary-secret", _link("summary.txt", "secret"), "summary.txt: a symbolic link out"),
    ("metrics-dev-zero", _link("metrics.jsonl", "/dev/zero"), "metrics.jsonl: a symbolic"),
    ("config-dev-zero", _link("config.yaml", "/dev/zero"), "config.yaml: a symbolic link"),
]


@pytest.mark.parametrize(
    "damage,expected", [c[1:] for c in REPORT_CASES], ids=[c[0] for c in REPORT_CASES]
)
def test_report_follows_no_link(capsys, box, finished, damage, expected):
    run = trained_run(box / "run", finished)
    damage(run, box)
    refused(capsys, ["report", run], expected, box)


@pytest.mark.parametrize("name", ["part-000000.npz", "predictions.json"])
def test_predict_writes_through_no_link(capsys, box, finished, name):
    (box / "out").mkdir()
    (box / "out" / name).symlink_to(box / "victim")
    argv = ["predict", finished, box / "t.txt", box / "out", "--no-progress", "--k", "2"]
    refused(capsys, argv, f"out/{name}: a symbolic link", box)


def test_predict_reads_no_latest_out_of_the_model(capsys, box, finished):
    run = trained_run(box / "run", finished)
    _link("model/LATEST", "/dev/zero")(run, box)
    argv = ["predict", run, box / "t.txt", box / "out", "--no-progress"]
    refused(capsys, argv, "model/LATEST: a symbolic link out of the folder", box)


@pytest.mark.parametrize("name", ["chunk-000000.npz", "manifest.json"])
def test_convert_writes_through_no_link(capsys, box, name):
    (box / "out").mkdir()
    (box / "out" / name).symlink_to(box / "victim")
    refused(capsys, ["convert", box / "t.txt", box / "out"], f"out/{name}: a symbolic", box)


def _predictions(folder: Path) -> None:
    parts = [write_part(str(folder), i, (np.zeros((2, 3)), np.ones((2, 3))), {}) for i in (0, 1)]
    write_manifest(str(folder), parts, {"k": 3}, {})


@pytest.mark.parametrize(
    "ref,expected",
    [
        ("../outside.npz", "points outside"),
        ("/etc/passwd", "is not a relative name"),
        ("link.npz", "a symbolic link out"),
    ],
)
def test_read_predictions_reads_only_its_folder(box, ref, expected):
    out = box / "preds"
    _predictions(out)
    shutil.copy(out / "part-000001.npz", box / "outside.npz")
    (out / "link.npz").symlink_to(box / "outside.npz")
    meta = json.loads((out / "predictions.json").read_text())
    meta["parts"][1]["file"] = ref
    (out / "predictions.json").write_text(json.dumps(meta))
    with pytest.raises(OutsideError, match=expected):
        read_predictions(str(out))
    (out / "predictions.json").unlink()
    (out / "predictions.json").symlink_to("/dev/zero")
    with pytest.raises(OutsideError, match="predictions.json: a symbolic link out"):
        read_predictions(str(out))


def _foreign(box: Path) -> Path:
    """Someone's folder that looks a little like a run folder."""
    folder = box / "mine"
    for name in (
        "summary.txt",
        "metrics.jsonl",
        "checkpoints/step-00000001-x/a.npy",
        "model/step-00000001-y/b.npy",
        "run.json",
    ):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b'{"format": "not-dslide"}' if name == "run.json" else b"x")
    return folder


def test_a_folder_of_other_files_is_no_run_dir(capsys, box):
    argv = ["train", *FAST, "--train", box / "t.txt", "--checkpoint-every", "1", "--run-dir"]
    refused(capsys, [*argv, _foreign(box)], "--run-dir", box)
    refused(capsys, [*argv, box / "victim"], "victim: a file, not a folder", box)
    (box / "empty").mkdir()
    assert cli.main([str(a) for a in [*argv, box / "empty"]]) == 0
    assert RunFolder(str(box / "empty")).is_run() and not (box / "empty" / LOCK).exists()


def test_a_held_run_folder_is_refused(capsys, box, finished):
    """A second run on a folder whose lock is held (by another open: as another process
    would): refused naming the folder and the holder; a new run and a resume alike."""
    run = trained_run(box / "run", finished)
    (box / "new").mkdir()
    locks = [RunLock(RunFolder(str(d)).fs, str(d), str(d)) for d in (run, box / "new")]
    for lock in locks:
        lock.acquire()
    try:
        holder = f"in use by another dslide run (pid {os.getpid()}"
        refused(capsys, ["train", "--resume", run, *RESUME], holder, box)
        argv = ["train", *FAST, "--train", box / "t.txt", "--run-dir", box / "new"]
        line = refused(capsys, argv, holder, box)
        assert str(box / "new") in line
    finally:
        for lock in locks:
            lock.release()
    assert not (run / LOCK).exists()


def test_a_stale_lock_is_taken_over(capsys, box):
    """A lock file whose holder died (no flock held) does not block the folder."""
    (box / "run").mkdir()
    (box / "run" / LOCK).write_text("pid 999999999 on nowhere since long ago\n")
    argv = ["train", *FAST, "--train", box / "t.txt", "--run-dir", box / "run"]
    assert cli.main([str(a) for a in argv]) == 0, capsys.readouterr().err
    assert not (box / "run" / LOCK).exists() and (box / "run" / "model" / "LATEST").exists()


@pytest.mark.slow
def test_sigterm_ends_a_run_as_ctrl_c_does(capsys, box):
    """SIGTERM to a LocalCluster run: its metrics are kept, the cluster closes (no
    leaked semaphore), exit 143; while it ran, a second run on its folder was refused."""
    run = box / "run"
    argv = [sys.executable, "-m", "dslide_workflows", "train", "--preset", "tiny"]
    argv += ["--epochs", "500", "--workers", "1", "--no-progress", "--log-every", "1"]
    argv += ["--opt", "hidden=[8]", "--run-dir", str(run)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.split()[:2] == ["step", "3"]:
                break
        else:
            pytest.fail(proc.stderr.read())
        holder = f"in use by another dslide run (pid {proc.pid}"
        resume = ["train", "--resume", run, "--in-process", "--epochs", "600"]
        refused(capsys, resume, holder, box / "D")
        assert cli.main(["train", "--preset", "tiny", "--run-dir", str(run)]) == 2
        assert holder in capsys.readouterr().err
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "dslide: terminated", err
    assert "leaked semaphore" not in err and "Traceback" not in err, err
    steps = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) >= 3 and steps[0]["kind"] == "step"
    assert not (run / LOCK).exists()

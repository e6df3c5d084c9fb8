"""Shared helpers of the hostile-input tests (``tests/test_hostile_*.py``): small valid
inputs to damage, working folders, a snapshot of a folder tree to prove that a failed
command changed nothing it should not, and the checks that a command failed cleanly (exit
2 and one line ``dslide: error: ...``)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

#: A valid XC text file: 6 points, 20 features, 5 labels.
TRAIN = b"6 20 5\n0 1:1 2:0.5\n1 3:1\n2,3 4:1 5:2\n4 6:1\n0 7:1 19:1\n1 8:1\n"
#: Flags that make a model train in a blink.
FAST = ["--in-process", "--no-progress", "--hidden", "8", "--batch-size", "2"]
FAST += ["--opt", "L=2", "--opt", "K=2", "--opt", "min_active=2", "--opt", "max_active=5"]
FAST += ["--opt", "threshold=1"]


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every file and folder under ``root`` (but ``skip``) with a digest of its bytes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            dirnames[:] = []
            continue
        for name in dirnames:
            if here / name != skip:
                out[str((here / name).relative_to(root)) + "/"] = "dir"
        for name in filenames:
            path = here / name
            if path.is_symlink():
                out[str(path.relative_to(root))] = "link:" + os.readlink(path)
            else:
                out[str(path.relative_to(root))] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


def trained_run_folder(root: Path) -> Path:
    """A run folder under ``root`` trained for one epoch with a checkpoint every step."""
    from dslide_workflows import cli

    (root / "t.txt").write_bytes(TRAIN)
    run = root / "run"
    argv = ["train", *FAST, "--train", str(root / "t.txt"), "--run-dir", str(run)]
    argv += ["--checkpoint-every", "1"]
    assert cli.main(argv) == 0
    return run


def work_folders(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """(an empty input folder, a run folder not yet made); the working directory is
    ``tmp_path/cwd`` and no scheduler address or debug switch leaks in from outside."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("DSLIDE_DEBUG", raising=False)
    inputs = tmp_path / "in"
    inputs.mkdir()
    return inputs, cwd / "run"


def work_folder(tmp_path: Path, monkeypatch) -> Path:
    """``tmp_path`` as the working directory, holding ``TRAIN`` as t.txt; no scheduler
    address or debug switch leaks in from outside."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("DSLIDE_DEBUG", raising=False)
    (tmp_path / "t.txt").write_bytes(TRAIN)
    return tmp_path


def failed_once(capsys, argv: list[str]) -> tuple[str, str]:
    """``dslide argv`` exits 2 with exactly one line on stderr: (that line, stdout)."""
    from dslide_workflows import cli

    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    return lines[0], out


def trained_run(dest: Path, source: Path) -> Path:
    """A copy of the finished run folder ``source`` at ``dest``."""
    shutil.copytree(source, dest, symlinks=True)
    return dest


def fails_cleanly(capsys, argv: list[str], expected: str, root: Path, run: Path) -> str:
    """Run ``dslide argv``: exit 2, one error line holding ``expected``, no stdout
    traceback, and nothing under ``root`` changed outside ``run``."""
    from dslide_workflows.run_folder import RunFolder

    before = snapshot(root, skip=run)
    run_before = snapshot(run) if run.exists() else None
    line, out = failed_once(capsys, argv)
    assert line.startswith("dslide: error: "), line
    assert expected in line, line
    assert "Traceback" not in out + line
    assert snapshot(root, skip=run) == before
    if run_before is None:  # a bad line in the training data is found while training
        assert not run.exists() or not RunFolder(str(run)).resumable()
    else:
        assert snapshot(run) == run_before, "a failed resume changed the run folder"
    return line


def one_error(capsys, argv: list[str], *expected: str) -> tuple[str, str]:
    """``dslide argv`` fails: exit 2, one line naming what ``expected`` says; (line, out)."""
    line, out = failed_once(capsys, argv)
    assert line.startswith("dslide: error: ") and len(line) <= 300, line
    assert "Traceback" not in out + line
    for text in expected:
        assert text in line, line
    return line, out

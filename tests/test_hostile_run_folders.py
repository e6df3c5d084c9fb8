"""Hostile and damaged run folders given to ``dslide train --resume`` (LATEST pointing
outside, config.yaml and checkpoint metadata that lie, truncated or flipped arrays), and
run folders that cannot be written or whose run failed: each case ends in one line
``dslide: error:`` naming the file, exit 2 (a bug: exit 1, and ``--debug`` shows it), and
a resumed run's folder is left untouched, nothing outside it written; a failed run does
not block its ``--run-dir``. As in test_hostile_data, every case runs in process.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from dslide_workflows import cli
from tests.hostile import (
    FAST,
    TRAIN,
    fails_cleanly,
    snapshot,
    trained_run,
    trained_run_folder,
    work_folders,
)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(input folder, run folder); the working directory is tmp_path/cwd."""
    return work_folders(tmp_path, monkeypatch)


# -- run folders and checkpoints ---------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run folder trained for one epoch with a checkpoint every step."""
    return trained_run_folder(tmp_path_factory.mktemp("finished"))


def _latest(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()


def _edit_meta(run: Path, change) -> None:
    for folder in (_latest(run), run / "model" / (run / "model" / "LATEST").read_text().strip()):
        meta = json.loads((folder / "meta.json").read_text())
        change(meta)
        (folder / "meta.json").write_text(json.dumps(meta))


def _set_entry(key, value):
    def change(meta):
        meta["arrays"]["hidden/W0"][key] = value

    return change


def _both_latest(text: bytes):
    def damage(run: Path):
        for d in ("checkpoints", "model"):
            (run / d / "LATEST").write_bytes(text)

    return damage


def _config(text: bytes):
    return lambda run: (run / "config.yaml").write_bytes(text)


def _config_edit(**changes):
    def damage(run: Path):
        import yaml

        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg.update(changes)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))

    return damage


def _deep_meta(run: Path) -> None:
    for d in ("checkpoints", "model"):
        folder = run / d / (run / d / "LATEST").read_text().strip()
        (folder / "meta.json").write_text("[" * 100000 + "]" * 100000)


def _truncate_w0(run: Path) -> None:
    for d in ("checkpoints", "model"):
        w0 = run / d / (run / d / "LATEST").read_text().strip() / "hidden" / "W0.npy"
        w0.write_bytes(w0.read_bytes()[:-10])


def _flip_w0(run: Path) -> None:
    for d in ("checkpoints", "model"):
        w0 = run / d / (run / d / "LATEST").read_text().strip() / "hidden" / "W0.npy"
        data = bytearray(w0.read_bytes())
        data[-1] ^= 0xFF
        w0.write_bytes(bytes(data))


def _no_checkpoints(run: Path) -> None:
    import shutil

    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "model")


def _outside_latest(run: Path) -> None:
    """LATEST names a complete checkpoint that lies outside the run folder."""
    import shutil

    shutil.copytree(_latest(run), run.parent / "elsewhere")
    _both_latest(b"../../elsewhere")(run)


RESUME_CASES = [
    (
        "performance-report-outside",
        _config_edit(performance_report="../../somewhere/f.html"),
        "config.yaml: performance_report '../../somewhere/f.html' is outside the run folder",
    ),
    (
        "performance-report-absolute",
        _config_edit(performance_report="/tmp/x.html"),
        "is outside the run folder",
    ),
    ("latest-outside", _outside_latest, "LATEST: '../../elsewhere' points outside"),
    ("latest-absolute", _both_latest(b"/etc"), "LATEST: '/etc' is not a relative name"),
    ("latest-nested", _both_latest(b"step-1/../../x"), "points outside"),
    ("latest-empty", _both_latest(b""), "LATEST: expected a name inside the folder"),
    ("latest-binary", _both_latest(b"\xff\xfe\x00"), "LATEST: not a checkpoint name"),
    ("latest-missing-folder", _both_latest(b"step-99999999-00000000"), "no checkpoint here"),
    ("config-not-yaml", _config(b"epochs: [\n"), "config.yaml:2: not valid YAML"),
    ("config-list", _config(b"- 1\n"), "config.yaml: expected a mapping of settings"),
    ("config-workers", _config_edit(workers="abc"), "config.yaml: workers must be an integer"),
    (
        "config-model-null-hidden",
        _config_edit(model={"hidden": None}),
        "hidden must be a width or a list of widths",
    ),
    (
        "config-storage-list",
        _config_edit(storage_options=[1]),
        "config.yaml: storage_options must be a mapping",
    ),
    (
        "meta-bytes-1.5e9",
        lambda r: _edit_meta(r, _set_entry("bytes", 1_500_000_000)),
        "bytes cannot hold",
    ),
    ("meta-bytes-1e12", lambda r: _edit_meta(r, _set_entry("bytes", 10**12)), "bytes cannot hold"),
    (
        "meta-bytes-text",
        lambda r: _edit_meta(r, _set_entry("bytes", "many")),
        "array 'hidden/W0' bytes must be an integer",
    ),
    (
        "meta-shape-huge",
        lambda r: _edit_meta(r, _set_entry("shape", [10**12, 8])),
        "bytes cannot hold",
    ),
    ("meta-dtype", lambda r: _edit_meta(r, _set_entry("dtype", "nonsense")), "unknown dtype"),
    (
        "meta-n-features-1e12",
        lambda r: _edit_meta(r, lambda m: m.update(n_features=10**12)),
        "n_features must be an integer in [1, 2147483647]",
    ),
    (
        "meta-n-features-mismatch",
        lambda r: _edit_meta(r, lambda m: m.update(n_features=10**6)),
        "hidden/W0 must have shape [1000000, 8]",
    ),
    (
        "meta-n-labels-float",
        lambda r: _edit_meta(r, lambda m: m.update(n_labels=5.5)),
        "n_labels must be an integer",
    ),
    ("meta-no-layout", lambda r: _edit_meta(r, lambda m: m.pop("layout")), "metadata lacks layout"),
    (
        "meta-shards-empty",
        lambda r: _edit_meta(r, lambda m: m.update(shards=[])),
        "shards must be a non-empty list",
    ),
    (
        "meta-layout-list",
        lambda r: _edit_meta(r, lambda m: m.update(layout=[1])),
        "layout is not a mapping",
    ),
    (
        "meta-position-bad",
        lambda r: _edit_meta(r, lambda m: m.update(position={"epoch": -1})),
        "position epoch must be an integer",
    ),
    (
        "meta-hidden-step",
        lambda r: _edit_meta(r, lambda m: m.update(hidden={})),
        "hidden step must be an integer",
    ),
    ("meta-deep", _deep_meta, "meta.json: not valid checkpoint JSON (nested too deeply)"),
    ("meta-not-object", lambda r: _edit_meta(r, lambda m: m.clear()), "not a dslide-dask"),
    ("array-truncated", _truncate_w0, "W0.npy: expected"),
    ("array-flipped", _flip_w0, "W0.npy: checksum mismatch"),
    ("nothing-to-resume", _no_checkpoints, "no checkpoint to resume from"),
]


@pytest.mark.parametrize(
    "damage,expected", [c[1:] for c in RESUME_CASES], ids=[c[0] for c in RESUME_CASES]
)
def test_hostile_run_folders(capsys, work, finished_run, damage, expected):
    """--resume of a damaged or hostile folder: one line, and nothing anywhere changed
    (its checkpoints are neither lost nor rewritten)."""
    inputs, run = work
    trained_run(run, finished_run)
    damage(run)
    root = inputs.parent
    before = snapshot(root)
    argv = ["train", "--resume", str(run), "--epochs", "3", "--in-process", "--no-progress"]
    fails_cleanly(capsys, argv, expected, root, run)
    assert snapshot(root) == before
    assert not (root / "somewhere").exists()


def test_resume_on_plain_file_and_missing(capsys, work):
    inputs, run = work
    (inputs / "file").write_bytes(b"x")
    base = ["train", "--in-process", "--resume"]
    fails_cleanly(
        capsys,
        [*base, str(inputs / "file")],
        "not a run folder (no config.yaml)",
        inputs.parent,
        run,
    )
    fails_cleanly(capsys, [*base, str(inputs / "nope")], "not a run folder", inputs.parent, run)


@pytest.mark.parametrize(
    "code,words",
    [(errno.EROFS, "read-only file system"), (errno.ENOSPC, "no space left on device")],
)
def test_unwritable_run_folder(capsys, work, monkeypatch, code, words):
    """A read-only or full disk under the run folder: one line naming the file."""
    from dslide_workflows import run_folder

    inputs, run = work
    (inputs / "t.txt").write_bytes(TRAIN)

    def refuse(self, name, text):
        raise OSError(code, os.strerror(code), self.path(name))

    monkeypatch.setattr(run_folder.RunFolder, "_write_text", refuse)
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / "t.txt")]
    line = cli.main(argv), capsys.readouterr().err
    assert line[0] == 2
    assert line[1].strip() == f"dslide: error: {run / 'config.yaml'}: {words}"


def test_failed_run_does_not_block_its_run_dir(capsys, work, monkeypatch):
    """A run that fails after writing config.yaml but before any checkpoint can be run
    again with the same --run-dir."""
    from dslide_dask.local_trainer import LocalTrainer

    inputs, run = work
    (inputs / "t.txt").write_bytes(TRAIN)
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / "t.txt")]

    def boom(*args, **kwargs):
        raise FloatingPointError("loss became nan")

    with monkeypatch.context() as m:
        m.setattr(LocalTrainer, "train", boom)
        assert cli.main(argv) == 2
    assert (run / "config.yaml").exists()
    assert cli.main(argv) == 0
    assert (run / "model" / "LATEST").exists()
    assert cli.main(argv) == 2  # now it holds a run: refused
    assert "already holds a run" in capsys.readouterr().err.splitlines()[-1]


def test_internal_errors_are_named_and_debug_shows_them(capsys, work, monkeypatch):
    """A bug (an unexpected exception type) is one line saying so, exit 1; --debug
    re-raises it."""
    from dslide_workflows import train

    inputs, run = work
    (inputs / "t.txt").write_bytes(TRAIN)

    def bug(*args):
        raise KeyError("oops")

    monkeypatch.setattr(train, "_check_memory", bug)
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / "t.txt")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dslide: error: internal error (KeyError: 'oops'); run again with")
    with pytest.raises(KeyError):
        cli.main(["--debug", *argv])

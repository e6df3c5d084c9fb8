"""Hostile and careless input to ``dslide``: each case ends in one line ``dslide: error:``
naming the file (and line) or the parameter, exit 2, and changes nothing on disk (no run
folder is left behind, a resumed run's folder is untouched, nothing outside it written).

Run in process (``cli.main``): every case fails before a model is built or a kernel runs
on the bad input, so none can crash pytest; the crash-prone paths are fuzzed in a
subprocess by ``test_fuzz_inputs``.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import pytest

from dslide_workflows import cli
from dslide_workflows.run_folder import RunFolder
from tests.hostile import (
    FAST,
    TRAIN,
    failed_once,
    snapshot,
    trained_run,
    trained_run_folder,
    work_folders,
)

GOOD_TEST = TRAIN


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


#: (id, {file name: bytes}, flags after "train", expected text in the error line).
#: ``{d}`` is the folder of the files.
DATA_CASES = [
    ("empty", {"t.txt": b""}, ["--train", "{d}/t.txt"], "t.txt:1: empty file"),
    ("blank-only", {"t.txt": b"\n \n"}, ["--train", "{d}/t.txt"], "t.txt:1: empty file"),
    (
        "header-words",
        {"t.txt": b"a b c\n"},
        ["--train", "{d}/t.txt"],
        "t.txt:1: header must be 3 non-negative integers",
    ),
    (
        "header-4",
        {"t.txt": b"1 2 3 4\n0 1:1\n"},
        ["--train", "{d}/t.txt"],
        "t.txt:1: header must be 3",
    ),
    ("header-negative", {"t.txt": b"-1 2 3\n"}, ["--train", "{d}/t.txt"], "t.txt:1: header"),
    (
        "bom",
        {"t.txt": b"\xef\xbb\xbf" + TRAIN},
        ["--train", "{d}/t.txt"],
        "t.txt:1: the file starts with a UTF-8 byte-order mark",
    ),
    ("utf16", {"t.txt": b"\xff\xfe" + TRAIN}, ["--train", "{d}/t.txt"], "UTF-16 byte-order mark"),
    (
        "blank-mid",
        {"t.txt": TRAIN.replace(b"1 3:1\n", b"\n1 3:1\n")},
        ["--train", "{d}/t.txt"],
        "t.txt:3: blank line in the middle of the file",
    ),
    (
        "feature-range",
        {"t.txt": TRAIN.replace(b"19:1", b"20:1")},
        ["--train", "{d}/t.txt"],
        "t.txt:6: feature id 20 >= n_features 20",
    ),
    (
        "label-range",
        {"t.txt": TRAIN.replace(b"4 6:1", b"5 6:1")},
        ["--train", "{d}/t.txt"],
        "t.txt:5: label id 5 >= n_labels 5",
    ),
    (
        "nan-value",
        {"t.txt": TRAIN.replace(b"3:1", b"3:nan")},
        ["--train", "{d}/t.txt"],
        "t.txt:3: non-finite value 'nan'",
    ),
    (
        "overflow",
        {"t.txt": TRAIN.replace(b"3:1", b"3:1e40")},
        ["--train", "{d}/t.txt"],
        "t.txt:3: value in feature '3:1e40' overflows float32",
    ),
    (
        "dup-label",
        {"t.txt": TRAIN.replace(b"2,3 ", b"3,3 ")},
        ["--train", "{d}/t.txt"],
        "t.txt:4: duplicate label id 3",
    ),
    (
        "dup-feature",
        {"t.txt": TRAIN.replace(b"4 6:1", b"4 6:1 6:2")},
        ["--train", "{d}/t.txt"],
        "t.txt:5: duplicate feature id 6",
    ),
    (
        "few-points",
        {"t.txt": TRAIN.replace(b"6 20 5", b"9 20 5")},
        ["--train", "{d}/t.txt"],
        "the file ends after 6 point(s) but the header says N_points = 9",
    ),
    (
        "extra-points",
        {"t.txt": TRAIN.replace(b"6 20 5", b"5 20 5")},
        ["--train", "{d}/t.txt"],
        "t.txt:7: more points than the header's N_points = 5",
    ),
    (
        "negative-feature",
        {"t.txt": TRAIN.replace(b"3:1", b"-3:1")},
        ["--train", "{d}/t.txt"],
        "t.txt:3: negative feature id -3",
    ),
    (
        "empty-label",
        {"t.txt": TRAIN.replace(b"2,3 ", b"2,,3 ")},
        ["--train", "{d}/t.txt"],
        "t.txt:4: empty label id",
    ),
    (
        "no-colon",
        {"t.txt": TRAIN.replace(b"3:1", b"3")},
        ["--train", "{d}/t.txt"],
        "t.txt:3: malformed feature '3'",
    ),
    (
        "truncated",
        {"t.txt": TRAIN[:-3]},
        ["--train", "{d}/t.txt"],
        "(the file ends mid-line: truncated?)",
    ),
    (
        "hidden-gzip",
        {"t.txt": _gz(TRAIN)},
        ["--train", "{d}/t.txt"],
        "t.txt: this is gzip-compressed data, but the name does not say so",
    ),
    (
        "corrupt-gzip",
        {"t.txt.gz": _gz(TRAIN)[:12] + b"\x00" * 20},
        ["--train", "{d}/t.txt.gz"],
        "t.txt.gz: ",
    ),
    (
        "truncated-gzip",
        {"t.txt.gz": _gz(TRAIN * 3)[:-9]},
        ["--train", "{d}/t.txt.gz"],
        "t.txt.gz: truncated gzip stream",
    ),
    ("binary", {"t.txt": bytes(range(256)) * 4}, ["--train", "{d}/t.txt"], "t.txt:1: header"),
    (
        "zero-points",
        {"t.txt": b"0 20 5\n"},
        ["--train", "{d}/t.txt"],
        "t.txt: no points to train on",
    ),
    ("huge-features", {"t.txt": b"1 2147483647 5\n0 1:1\n"}, ["--train", "{d}/t.txt"], "bytes"),
    (
        "huge-labels",
        {"t.txt": b"1 20 2147483647\n0 1:1\n"},
        ["--train", "{d}/t.txt"],
        "more than the",
    ),
    (
        "over-int32",
        {"t.txt": b"1 2147483648 5\n0 1:1\n"},
        ["--train", "{d}/t.txt"],
        "t.txt:1: header N_features 2147483648 exceeds the int32 limit",
    ),
    (
        "points-over-size",
        {"t.txt": b"999999 20 5\n0 1:1\n"},
        ["--train", "{d}/t.txt"],
        "t.txt:1: header N_points 999999 exceeds the file size",
    ),
    ("missing-train", {}, ["--train", "{d}/nope.txt"], "nope.txt"),
    ("empty-folder", {"sub/_SUCCESS": b""}, ["--train", "{d}/sub"], "no data files in the folder"),
    ("no-glob-match", {}, ["--train", "{d}/x-*.txt"], "no files match"),
    (
        "parts-disagree",
        {"p/a.txt": TRAIN, "p/b.txt": TRAIN.replace(b"6 20 5", b"6 21 5")},
        ["--train", "{d}/p"],
        "b.txt:1: header says 21 features and 5 labels",
    ),
    (
        "test-more-features",
        {"t.txt": TRAIN, "x.txt": b"1 2000000000 5\n0 1999999999:1\n"},
        ["--train", "{d}/t.txt", "--test", "{d}/x.txt"],
        "x.txt has 2000000000 features and 5 labels, the model 20 and 5",
    ),
    (
        "test-fewer-features",
        {"t.txt": TRAIN, "x.txt": b"1 5 5\n0 1:1\n"},
        ["--train", "{d}/t.txt", "--test", "{d}/x.txt"],
        "x.txt has 5 features and 5 labels",
    ),
    (
        "test-fewer-labels",
        {"t.txt": TRAIN, "x.txt": b"1 20 2\n0 1:1\n"},
        ["--train", "{d}/t.txt", "--test", "{d}/x.txt"],
        "x.txt has 20 features and 2 labels",
    ),
    (
        "test-missing",
        {"t.txt": TRAIN},
        ["--train", "{d}/t.txt", "--test", "{d}/gone.txt"],
        "gone.txt",
    ),
    (
        "test-bad-line",
        {"t.txt": TRAIN, "x.txt": TRAIN.replace(b"3:1", b"3:x")},
        ["--train", "{d}/t.txt", "--test", "{d}/x.txt"],
        "x.txt:3: bad value 'x'",
    ),
    (
        "test-all-bad-skipped",
        {"t.txt": TRAIN, "x.txt": b"1 20 5\n0 1:x\n"},
        ["--train", "{d}/t.txt", "--test", "{d}/x.txt", "--skip-bad-lines"],
        "x.txt: no points to evaluate on",
    ),
]

FLAG_CASES = [
    ("workers-negative", ["--workers", "-1"], "--workers must be an integer in [1, 65536], got -1"),
    ("workers-zero", ["--workers", "0"], "--workers must be an integer in [1, 65536], got 0"),
    ("eval-points-zero", ["--eval-points", "0"], "--eval-points must be an integer in [1,"),
    ("eval-points-negative", ["--eval-points", "-1"], "--eval-points must be an integer in [1,"),
    ("eval-every-negative", ["--eval-every", "-5"], "--eval-every must be an integer in [0,"),
    (
        "checkpoint-minutes-nan",
        ["--checkpoint-minutes", "nan"],
        "--checkpoint-minutes must be a number in [0, 1e+09], got nan",
    ),
    ("checkpoint-minutes-negative", ["--checkpoint-minutes", "-1"], "--checkpoint-minutes must"),
    ("checkpoint-every-negative", ["--checkpoint-every", "-1"], "--checkpoint-every must"),
    ("keep-negative", ["--keep-checkpoints", "-2"], "--keep-checkpoints must"),
    ("n-shards-zero", ["--n-shards", "0"], "--n-shards must be an integer in [1,"),
    ("threads-per-worker", ["--threads-per-worker", "0"], "--threads-per-worker must"),
    ("log-every", ["--log-every", "-1"], "--log-every must be >= 0, got -1"),
    ("hidden-float", ["--opt", "hidden=[1.9]"], "hidden must be a width or a list of widths"),
    ("hidden-null", ["--opt", "hidden=null"], "hidden must be a width or a list of widths"),
    ("hidden-text", ["--opt", "hidden=abc"], "hidden must be a width or a list of widths"),
    ("seed-twice", ["--opt", "seed=5", "--seed", "3"], "the seed is given twice"),
    ("seed-negative", ["--seed", "-3"], "--seed must be an integer in [0,"),
    ("opt-unknown", ["--opt", "nonsense=1"], "unknown parameter(s) ['nonsense']"),
    ("opt-lr-nan", ["--opt", "lr=.nan"], "lr must be a number in"),
    ("opt-K-zero", ["--opt", "K=0"], "K must be an integer in"),
    ("opt-no-equals", ["--opt", "lr"], "expected key=value, got 'lr'"),
    ("batch-size-zero", ["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    ("epochs-text", ["--epochs", "two"], "argument --epochs: expected an integer, got 'two'"),
    ("hidden-flag-zero", ["--hidden", "0"], "hidden widths must be positive"),
    ("wire-dtype", ["--wire-dtype", "int8"], "argument --wire-dtype: invalid choice"),
    ("train-and-preset", ["--preset", "tiny"], "give exactly one of --train URL or --preset"),
    (
        "performance-report-in-process",
        ["--performance-report", "r.html"],
        "--performance-report needs a Dask cluster",
    ),
    (
        "storage-option-nest",
        ["--storage-option", "a=1", "--storage-option", "a.b=2"],
        "storage option 'a.b' nests under a non-mapping value",
    ),
]

CONFIG_CASES = [
    ("yaml-syntax", b"epochs: [1, 2\n", "c.yaml:2: not valid YAML"),
    ("yaml-binary", bytes(range(256)), "c.yaml: not a YAML text file"),
    (
        "workers-abc",
        b"workers: abc\n",
        "c.yaml: workers must be an integer in [1, 65536], got 'abc'",
    ),
    (
        "epochs-two",
        b"epochs: two\n",
        "c.yaml: epochs must be an integer in [1, 1048576], got 'two'",
    ),
    ("model-list", b"model: [1, 2]\n", "c.yaml: model: model must be a mapping of parameters"),
    (
        "train-number",
        b"train: 12345\n",
        "c.yaml: train must be a non-empty text (a URL), got 12345",
    ),
    ("top-level-list", b"- 1\n- 2\n", "c.yaml: expected a mapping of settings"),
    ("unknown-key", b"epoch: 3\n", "c.yaml: unknown setting(s) ['epoch']"),
    (
        "storage-options-number",
        b"storage_options: 5\n",
        "c.yaml: storage_options must be a mapping",
    ),
    ("minutes-nan", b"checkpoint_minutes: .nan\n", "c.yaml: checkpoint_minutes must be a number"),
    ("pipeline-text", b"pipeline: maybe\n", "c.yaml: pipeline must be true or false"),
    ("hidden-float", b"model: {hidden: [1.5]}\n", "hidden must be a width or a list of widths"),
    ("deep-nesting", b"[" * 20000 + b"]" * 20000, "c.yaml"),
    ("seed-twice", b"seed: 1\nmodel: {seed: 2}\n", "the seed is given twice"),
]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(input folder, run folder); the working directory is tmp_path/cwd."""
    return work_folders(tmp_path, monkeypatch)


def fails_cleanly(capsys, argv: list[str], expected: str, root: Path, run: Path) -> str:
    """Run ``dslide argv``: exit 2, one error line holding ``expected``, no stdout
    traceback, and nothing under ``root`` changed outside ``run``."""
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


@pytest.mark.parametrize(
    "files,flags,expected", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES]
)
def test_bad_data_files(capsys, work, files, flags, expected):
    inputs, run = work
    for name, data in files.items():
        (inputs / name).parent.mkdir(parents=True, exist_ok=True)
        (inputs / name).write_bytes(data)
    argv = ["train", *FAST, "--run-dir", str(run), *(f.format(d=inputs) for f in flags)]
    fails_cleanly(capsys, argv, expected, inputs.parent, run)


@pytest.mark.parametrize(
    "flags,expected", [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES]
)
def test_bad_flags(capsys, work, flags, expected):
    inputs, run = work
    (inputs / "t.txt").write_bytes(TRAIN)
    argv = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / "t.txt"), *flags]
    fails_cleanly(capsys, argv, expected, inputs.parent, run)


@pytest.mark.parametrize(
    "text,expected", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_bad_configs(capsys, work, text, expected):
    inputs, run = work
    (inputs / "t.txt").write_bytes(TRAIN)
    (inputs / "c.yaml").write_bytes(text)
    argv = ["train", *FAST, "--run-dir", str(run), "--config", str(inputs / "c.yaml")]
    if not text.startswith(b"train:"):
        argv += ["--train", str(inputs / "t.txt")]
    fails_cleanly(capsys, argv, expected, inputs.parent, run)


def test_config_folder_and_missing(capsys, work):
    inputs, run = work
    base = ["train", *FAST, "--run-dir", str(run), "--train", str(inputs / "t.txt")]
    fails_cleanly(
        capsys, [*base, "--config", str(inputs)], "in: is a directory", inputs.parent, run
    )
    fails_cleanly(
        capsys,
        [*base, "--config", str(inputs / "no.yaml")],
        "no.yaml: no such file or directory",
        inputs.parent,
        run,
    )


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


def test_corpus_size():
    n = len(DATA_CASES) + len(FLAG_CASES) + len(CONFIG_CASES) + len(RESUME_CASES) + 2 + 2
    assert n >= 60

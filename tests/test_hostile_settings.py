"""Hostile and careless settings given to ``dslide train``: flags, ``--opt`` values and
config files (YAML that does not parse, wrong types, unknown keys, values out of range,
a folder or a missing file). Each case ends in one line ``dslide: error:`` naming the
parameter (and the config file), exit 2, and changes nothing on disk; as in
test_hostile_data, every case runs in process and fails before a model is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import FAST, TRAIN, fails_cleanly, work_folders

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

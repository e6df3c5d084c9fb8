"""Hostile and careless data files given to ``dslide train`` (``--train``, ``--test``):
each case ends in one line ``dslide: error:`` naming the file and line, exit 2, and
changes nothing on disk (no run folder is left behind, nothing outside it written).

The hostile-input corpus goes on in test_hostile_settings (flags and config files) and
test_hostile_run_folders (damaged run folders to resume, failing runs). Every case runs in
process (``cli.main``): each fails before a model is built or a kernel runs on the bad
input, so none can crash pytest; the crash-prone paths are fuzzed in a subprocess by
``test_fuzz_inputs``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.hostile import FAST, TRAIN, fails_cleanly, work_folders
from tests.test_hostile_run_folders import RESUME_CASES
from tests.test_hostile_settings import CONFIG_CASES, FLAG_CASES


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


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(input folder, run folder); the working directory is tmp_path/cwd."""
    return work_folders(tmp_path, monkeypatch)


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


# -- the corpus: here, in test_hostile_settings and in test_hostile_run_folders ----------------
def test_corpus_size():
    n = len(DATA_CASES) + len(FLAG_CASES) + len(CONFIG_CASES) + len(RESUME_CASES) + 2 + 2
    assert n >= 60

"""A saved model keeps its training label counts: PSP@k after ``load`` (issue 53), in
this process and on a cluster, for a model without a neighbour index to hold them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dslide_dask import SlideClassifier
from dslide_dask.checkpoint import CheckpointError
from tests.conftest import no_pairs

PSP = ("PSP@1", "PSP@3", "PSP@5", "PSnDCG@5")


def _fit(tiny, client=False) -> SlideClassifier:
    train, _ = tiny
    params = dict(epochs=1, hidden=(32,), neighbours=0, random_state=0)
    return SlideClassifier(client=client, **params).fit(train.X[:1500], train.Y[:1500])


def _meta(folder: Path) -> tuple[Path, dict]:
    (path,) = folder.rglob("meta.json")
    return path, json.loads(path.read_text())


def test_psp_after_load_in_process(tiny, tmp_path: Path) -> None:
    _, test = tiny
    clf = _fit(tiny)
    before = clf.evaluate(test.X, test.Y)
    assert set(PSP) <= set(before)
    clf.save(str(tmp_path / "m"))
    again = SlideClassifier.load(str(tmp_path / "m")).evaluate(test.X, test.Y)
    assert {k: again[k] for k in PSP} == pytest.approx({k: before[k] for k in PSP})


def test_psp_after_load_of_a_cluster_model_here_and_on_the_cluster(tiny, client, tmp_path):
    _, test = tiny
    clf = _fit(tiny, client)
    before = clf.evaluate(test.X, test.Y)
    kept = clf.evaluate(test.X, test.Y, exclude=no_pairs(len(test), test.n_labels))
    assert kept == pytest.approx(before)  # the counts as the coordinator has them
    clf.save(str(tmp_path / "m"))
    clf.close()
    here = SlideClassifier.load(str(tmp_path / "m")).evaluate(test.X, test.Y)
    there = SlideClassifier.load(str(tmp_path / "m"), client=client)
    try:
        on_cluster = there.evaluate(test.X, test.Y)
    finally:
        there.close()
    for got in (here, on_cluster):
        assert {k: got[k] for k in PSP} == pytest.approx({k: before[k] for k in PSP})


@pytest.fixture
def saved(tiny, tmp_path: Path) -> Path:
    _fit(tiny).save(str(tmp_path / "m"))
    return tmp_path / "m"


def test_a_model_saved_before_the_counts_loads_without_psp(tiny, saved: Path) -> None:
    path, meta = _meta(saved)
    del meta["training_labels"]
    path.write_text(json.dumps(meta))
    got = SlideClassifier.load(str(saved)).evaluate(tiny[1].X, tiny[1].Y)
    assert "P@1" in got and "PSP@1" not in got


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda b: b.update(shape=[7]), "one count a label"),
        (lambda b: b.update(rows=0), "rows must be a positive integer"),
        (lambda b: b.update(n_points="many"), "n_points must be a positive integer"),
        (lambda b: b.update(crc32=b["crc32"] ^ 1), "checksum"),
        (lambda b: b.update(rows=1), "label counts must be in [0, 1]"),
    ],
    ids=["shape", "rows", "n_points", "crc", "counts"],
)
def test_damaged_counts_are_named(saved: Path, edit, words) -> None:
    path, meta = _meta(saved)
    edit(meta["training_labels"])
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=words.replace("[", r"\[").replace("]", r"\]")):
        SlideClassifier.load(str(saved))


def test_a_missing_counts_file_is_named(saved: Path) -> None:
    (file,) = saved.rglob("label_counts.npy")
    file.unlink()
    with pytest.raises(CheckpointError, match="label_counts.npy"):
        SlideClassifier.load(str(saved))

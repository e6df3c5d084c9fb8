"""A save is whole or not at all: every part of a model (network, neighbour index, label
trees, output index) is written before ``LATEST`` names it and the older model is
pruned, so a save cut short, or a full disk, leaves the previous model loadable; two
processes saving to one folder take turns."""

import multiprocessing
import os

import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.checkpoint import arrays as array_files
from dslide_dask.data import make_synthetic

PARAMS = dict(hidden=(32,), K=3, L=10, range_pow=8, lr=1e-2, batch_size=128, random_state=0)


@pytest.fixture(scope="module")
def fitted():
    train, test = make_synthetic("tiny", seed=0)
    first = SlideClassifier(epochs=1, label_tree=0.5, client=False, **PARAMS)
    second = SlideClassifier(epochs=2, label_tree=0.5, client=False, **PARAMS)
    return first.fit(train.X, train.Y), second.fit(train.X, train.Y), test


class _CutShort(OSError):
    pass


def _fail_after(monkeypatch, n: int, error: OSError) -> list[str]:
    """Array writes after the ``n``-th raise ``error`` (a kill or a full disk mid-save);
    the paths written before, in order."""
    written: list[str] = []
    real = array_files.write_array

    def write(fs, path, array):
        if len(written) >= n:
            raise error
        written.append(path)
        return real(fs, path, array)

    for module in ("dslide_dask.checkpoint.store", "dslide_dask.checkpoint.neighbours"):
        monkeypatch.setattr(f"{module}.write_array", write)
    return written


def test_every_part_is_written_before_latest_names_the_model(fitted, tmp_path, monkeypatch):
    first, second, _ = fitted
    url = str(tmp_path / "model")
    first.save(url)
    written = _fail_after(monkeypatch, 1 << 30, _CutShort())
    second.save(url)
    assert any("/neighbours/" in p for p in written) and any("/shard-" in p for p in written)
    # the neighbour index went into the folder LATEST names, and nothing is left of the old
    latest = (tmp_path / "model" / "LATEST").read_text().strip()
    assert all(f"/{latest}/" in p for p in written)
    assert sorted(p.name for p in (tmp_path / "model").glob("step-*")) == [latest]


@pytest.mark.parametrize("where", ["network", "neighbours", "trees"])
@pytest.mark.parametrize("error", [_CutShort("killed"), OSError(28, "No space left on device")])
def test_a_save_cut_short_leaves_the_previous_model_whole(
    fitted, tmp_path, monkeypatch, where, error
):
    first, second, test = fitted
    url = str(tmp_path / "model")
    first.save(url)
    want = first.predict_topk(test.X, 5)
    counting = _fail_after(monkeypatch, 1 << 30, _CutShort())
    second.save(str(tmp_path / "count"))
    parts = {
        "network": next(i for i, p in enumerate(counting) if "/shard-" in p),
        "neighbours": next(i for i, p in enumerate(counting) if "/neighbours/" in p),
        "trees": next(i for i, p in enumerate(counting) if "/neighbours/tree" in p),
    }
    _fail_after(monkeypatch, parts[where], error)
    with pytest.raises(OSError):
        second.save(url)
    monkeypatch.undo()
    again = SlideClassifier.load(url)
    assert again.fused_model() is not None and again.neighbours_.trees
    np.testing.assert_array_equal(again.predict_topk(test.X, 5), want)


def _save_many(url: str, seed: int, times: int, start) -> None:
    train, _ = make_synthetic("tiny", seed=0)
    params = {**PARAMS, "random_state": seed}
    clf = SlideClassifier(epochs=1, label_tree=0.5, client=False, **params)
    clf.fit(train.X, train.Y)
    start.wait(timeout=300)  # both fitted: the saves overlap
    for _ in range(times):
        clf.save(url)


def test_two_processes_saving_to_one_folder_take_turns(tmp_path):
    url = str(tmp_path / "model")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    workers = [ctx.Process(target=_save_many, args=(url, s, 10, start)) for s in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    assert [w.exitcode for w in workers] == [0, 0]
    clf = SlideClassifier.load(url)  # whole: one of the two, with its fused parts
    assert clf.fused_model() is not None
    assert len([n for n in os.listdir(url) if n.startswith("step-")]) == 1

"""Hostile input, third round: a saved model's files edited by hand or by a hostile
party, checksums rewritten to match (so only the content is wrong). Loading refuses each
with one :class:`CheckpointError` naming the file or the setting, and ``dslide predict``
with one line ``dslide: error: ...`` and exit 2, where it hung (a FIFO listed as an
empty array), answered garbage (NaN, infinity or values out of range, parts the saved
settings need but the manifest no longer lists) or failed later with an internal error
(another model's neighbours, an output index faiss cannot search, a bad value in
``meta.json``'s estimator block, fewer classes than labels).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
import scipy.sparse as sp

from dslide_dask import SlideClassifier
from dslide_dask.checkpoint.arrays import CheckpointError, read_array, write_array
from dslide_dask.data.xc_text import write_xc
from tests.hostile import failed_once

PARAMS = dict(hidden=(32,), K=3, L=10, range_pow=8, lr=1e-2, batch_size=128, random_state=0)
INDEX = {"lists": 4, "probes": 2, "candidates": 20, "head": 16}


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory) -> Path:
    """A fused model (neighbours, hidden vectors, a label tree: ``label_tree=0.5``) saved
    with an output index, and 20 test rows beside it (``test.txt``)."""
    train, test = tiny
    root = tmp_path_factory.mktemp("hostile-models")
    clf = SlideClassifier(epochs=1, label_tree=0.5, client=False, **PARAMS)
    clf.fit(train.X, train.Y).build_index(**INDEX).save(str(root / "model"))
    write_xc(str(root / "test.txt"), test.slice(0, 20))
    return root


@pytest.fixture
def model(saved, tmp_path, monkeypatch) -> Path:
    """A copy of the saved model to damage (``tmp_path/model``), ``test.txt`` beside it."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("DSLIDE_DEBUG", raising=False)
    shutil.copytree(saved / "model", tmp_path / "model")
    shutil.copy(saved / "test.txt", tmp_path / "test.txt")
    return tmp_path / "model"


def folder(model: Path) -> Path:
    return model / (model / "LATEST").read_text().strip()


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def replace_array(model: Path, name: str, change, manifest: str = "meta.json") -> None:
    """Rewrite the array ``name`` (``sub/name``, as ``change`` makes it from the saved
    one) and its entry in ``manifest``: the size and checksums agree, only the content is
    wrong."""
    where = folder(model)
    path = where / f"{name}.npy"
    array = change(np.load(path).copy())
    path.unlink()
    entry = write_array(fsspec.filesystem("file"), str(path), array)
    key = name if manifest == "meta.json" else name.rsplit("/", 1)[1]

    def update(data):
        data["arrays"][key] = {**data["arrays"][key], **entry}
        data["arrays"][key].pop("sha256", None)

    _edit_json(where / manifest, update)


def drop_arrays(model: Path, manifest: str, gone) -> None:
    def update(data):
        data["arrays"] = {k: v for k, v in data["arrays"].items() if not gone(k)}

    _edit_json(folder(model) / manifest, update)


def predict_argv(model: Path, *flags: str) -> list[str]:
    root = model.parent
    return ["predict", str(model), str(root / "test.txt"), str(root / "out"), *flags]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` with a digest of a file's bytes (a FIFO is not read)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = path.read_bytes().hex() if path.is_file() else path.stat().st_mode
    return out


def refused(capsys, model: Path, expected: str, *flags: str) -> None:
    """Loading the model raises one CheckpointError matching ``expected``, and so does
    ``dslide predict`` (exit 2, one line); nothing under the model's parent changes."""
    before = snapshot(model.parent)
    with pytest.raises(CheckpointError, match=expected) as info:
        SlideClassifier.load(str(model))
    assert "\n" not in str(info.value)
    line, out = failed_once(
        capsys, predict_argv(model, "--workers", "1", "--dashboard-address", "127.0.0.1:0", *flags)
    )
    assert line.startswith("dslide: error: ") and len(line) <= 300, line
    assert re.search(expected, line), line
    assert "Traceback" not in out
    assert snapshot(model.parent) == before


# -- a hang: a FIFO where an array should be ------------------------------------------------
def _fifo(model: Path, name: str, manifest: str) -> None:
    path = folder(model) / f"{name}.npy"
    path.unlink()
    os.mkfifo(path)
    key = name.rsplit("/", 1)[1]

    def update(data):
        data["arrays"][key].update(bytes=0, shape=[0])

    _edit_json(folder(model) / manifest, update)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "manifest", "flags"),
    [
        ("neighbours/y_idx", "neighbours/index.json", ()),
        ("output_index/head", "output_index/index.json", ("--index",)),
    ],
)
def test_a_fifo_listed_as_an_empty_array_is_refused_not_waited_on(
    capsys, model, name, manifest, flags
):
    _fifo(model, name, manifest)
    refused(capsys, model, f"{name}.npy: not a regular file", *flags)


@pytest.mark.timeout(60)
def test_no_array_is_read_from_a_fifo(tmp_path):
    """Every array of a checkpoint is read through :func:`read_array`: a FIFO is refused
    before it is opened, whatever its entry says."""
    os.mkfifo(tmp_path / "a.npy")
    entry = {"bytes": 0, "crc32": 0, "dtype": "<f4", "shape": [0]}
    with pytest.raises(CheckpointError, match="a.npy: not a regular file"):
        read_array(fsspec.filesystem("file"), str(tmp_path / "a.npy"), entry)


# -- silent wrong answers --------------------------------------------------------------------
def _set(value: float, at: int = 3):
    def change(a: np.ndarray) -> np.ndarray:
        a.reshape(-1)[at] = value
        return a

    return change


@pytest.mark.parametrize(
    ("name", "manifest", "value", "expected"),
    [
        ("neighbours/post_val", "neighbours/index.json", np.nan, "post_val.npy: holds a NaN"),
        ("neighbours/post_val", "neighbours/index.json", np.inf, "post_val.npy: holds a NaN"),
        ("neighbours/post_val", "neighbours/index.json", 3e38, r"post_val.npy: .* \[-1, 1\]"),
        ("neighbours/embedding", "neighbours/index.json", 7.0, r"embedding.npy: .* \[-1, 1\]"),
        ("shard-0000/W", "meta.json", np.nan, "/W.npy: holds a NaN"),
        ("hidden/W0", "meta.json", np.nan, "/W0.npy: holds a NaN"),
        ("hidden/W0", "meta.json", -np.inf, "/W0.npy: holds a NaN"),
    ],
)
def test_non_finite_or_out_of_range_values_are_refused(
    capsys, model, name, manifest, value, expected
):
    replace_array(model, name, _set(value), manifest)
    if manifest == "meta.json":  # else the output index is refused first, as foreign
        shutil.rmtree(folder(model) / "output_index")
    refused(capsys, model, expected)


@pytest.mark.parametrize(
    ("gone", "expected"),
    [
        (lambda k: k.startswith("tree_"), r"lists no label trees, .*label_tree > 0"),
        (lambda k: k == "embedding", r"lists no embedding, .*hidden-space weight > 0"),
    ],
    ids=["trees", "embedding"],
)
def test_a_part_the_settings_rank_with_may_not_go_missing(capsys, model, gone, expected):
    meta = json.loads((folder(model) / "meta.json").read_text())
    assert meta["fusion"]["label_tree"] == 0.5 and meta["fusion"]["neighbour_weight"][1] > 0
    drop_arrays(model, "neighbours/index.json", gone)
    refused(capsys, model, "neighbours/index.json: " + expected)


# -- another model's parts, and settings faiss or the estimator cannot use -----------------
def _other_neighbours(tmp: Path, tiny, n_features: int = 0, **params) -> Path:
    """The ``neighbours/`` folder of another model: ``n_features`` (the first ones of the
    data) or other ``params``."""
    train, _ = tiny
    X = sp.csr_matrix((train.X.values(), train.X.indices, train.X.indptr), train.X.shape)
    X = X[:, :n_features] if n_features else X
    other = SlideClassifier(epochs=1, client=False, **{**PARAMS, **params})
    other.fit(X, train.Y.to_lists()).save(str(tmp / "other"))
    return folder(tmp / "other") / "neighbours"


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        ({"hidden": (64,)}, "hidden vectors of shape [5000, 64], the model's last hidden layer"),
        ({"n_features": 1500}, "an index of 1500 features, the model has 2000"),
    ],
    ids=["64-wide", "1500-features"],
)
def test_another_models_neighbours_are_refused(capsys, model, tiny, tmp_path, other, expected):
    mine = folder(model) / "neighbours"
    shutil.rmtree(mine)
    shutil.copytree(_other_neighbours(tmp_path, tiny, **other), mine)
    shutil.rmtree(tmp_path / "other")
    refused(capsys, model, "neighbours/index.json: " + re.escape(expected))


def _settings(**change):
    return lambda data: data["settings"].update(change)


def _more_centroids(model: Path) -> None:
    """Three centroids added to the index's quantizer (faiss keeps its lists: 4)."""
    import faiss

    blob = np.load(folder(model) / "output_index" / "faiss.npy")
    index = faiss.deserialize_index(blob)
    quantizer = faiss.try_extract_index_ivf(index).quantizer
    quantizer.add(np.random.default_rng(0).random((3, quantizer.d), np.float32))
    replace_array(
        model,
        "output_index/faiss",
        lambda _: faiss.serialize_index(index),
        "output_index/index.json",
    )

    def sha(data):
        raw = np.load(folder(model) / "output_index" / "faiss.npy")
        data["arrays"]["faiss"]["sha256"] = hashlib.sha256(raw.data).hexdigest()

    _edit_json(folder(model) / "output_index" / "index.json", sha)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_settings(probes=0), r"index.json: settings: probes must be in \[1, 4\] \(the lists\)"),
        (_settings(probes=9), r"index.json: settings: probes must be in \[1, 4\] \(the lists\)"),
        (_settings(lists=0), r"index.json: settings: lists must be at least 1"),
        (_more_centroids, r"faiss.npy: 4 lists but 7 centroids, the manifest says 4 lists"),
    ],
    ids=["probes-0", "probes-9", "lists-0", "more-centroids"],
)
def test_an_output_index_faiss_cannot_search_is_refused(capsys, model, damage, expected):
    manifest = folder(model) / "output_index" / "index.json"
    if damage is _more_centroids:
        damage(model)
    else:
        _edit_json(manifest, damage)
    refused(capsys, model, expected, "--index")


def _estimator(**change):
    return lambda meta: meta["estimator"].update(change)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (
            _estimator(neighbours=1e12),
            r"neighbours must be an integer in \[0, 65536\], got 1000000000000.0",
        ),
        (_estimator(classes=list(range(999))), "classes must be 1000 distinct classes, got 999"),
    ],
    ids=["neighbours-1e12", "999-classes"],
)
def test_bad_estimator_values_in_meta_json_are_refused(capsys, model, damage, expected):
    _edit_json(folder(model) / "meta.json", damage)
    refused(capsys, model, "meta.json: estimator: " + expected)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_estimator(K=0), r"K must be an integer in \[1, "),
        (_estimator(lr=-1), r"lr must be a number in \(0.0, 10.0\]"),
        (_estimator(epochs="3"), r"epochs must be an integer in \[1, 1048576\], got '3'"),
        (_estimator(label_tree=9), r"label_tree must be a number in \[0.0, 2.0\], got 9"),
        (_estimator(n_label_trees=0), r"n_label_trees must be an integer in \[1, 8\]"),
        (_estimator(neighbour_weight=[0.9, 0.9]), "neighbour_weight must be None, a number"),
        (_estimator(tail_exponent=1.0), r"tail_exponent must be a number in \[0.0, 0.4\]"),
        (_estimator(random_state=-1), r"random_state must be an integer in \[0, "),
        (_estimator(classes=[1, 1, *range(2, 1000)]), "classes must be 1000 distinct classes"),
        (_estimator(classes=[[1], *range(1, 1000)]), "classes must be 1000 distinct classes"),
        (lambda meta: meta.update(estimator=[]), "estimator must be an object"),
    ],
)
def test_the_estimator_block_is_checked_on_load(model, damage, expected):
    _edit_json(folder(model) / "meta.json", damage)
    with pytest.raises(CheckpointError, match="meta.json: estimator.*" + expected):
        SlideClassifier.load(str(model))


def test_a_multi_class_model_keeps_its_classes(tiny, tmp_path):
    train, test = tiny
    y = np.array([f"c{i % 7}" for i in range(train.n_points)])
    clf = SlideClassifier(epochs=1, neighbours=0, client=False, **PARAMS).fit(train.X, y)
    loaded = SlideClassifier.load(clf.save(str(tmp_path / "model")))
    assert list(loaded.classes_) == [f"c{i}" for i in range(7)]


# -- input values float32 arithmetic cannot take --------------------------------------------
def test_values_past_1e15_are_refused_by_line_not_answered_with_zeros(capsys, model):
    """A value of 1e20 gave one label and then scores of 0 (its square overflows the
    row's norm); the reader refuses any magnitude past 1e15, naming the file and line."""
    from dslide_dask.data.xc_text import XCFormatError, read_xc

    data = model.parent / "big.txt"
    data.write_text("2 2000 1000\n0 1:1e15 5:0.5\n1 1:-1e20 7:1\n")
    with pytest.raises(XCFormatError, match=r"big.txt:3: value in feature '1:-1e20' overflows"):
        read_xc(str(data))
    argv = ["predict", str(model), str(data), str(model.parent / "out"), "--workers", "1"]
    line, _ = failed_once(capsys, [*argv, "--dashboard-address", "127.0.0.1:0"])
    assert "big.txt:3: value in feature '1:-1e20' overflows" in line, line
    assert r"[-1e+15, 1e+15]" in line and not (model.parent / "out").exists()
    data.write_text("2 2000 1000\n0 1:1e15 5:0.5\n1 1:-1e15 7:1\n")  # the bound itself: read
    assert read_xc(str(data)).X.values().max() == np.float32(1e15)

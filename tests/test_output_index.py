"""The output index (faiss IVF over the output layer, candidates scored exactly): its
answers against a dense numpy reference, its files, and its commands."""

import json
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.data.xc_text import write_xc
from dslide_dask.inference.recall import recall_at_k
from dslide_dask.kernels.rescore import rescore_topk
from dslide_dask.model.lsh_index import LSHQuery
from dslide_dask.model.network import SlideNetwork
from dslide_dask.model.output_index import IndexSettings, OutputIndex, faiss_module, head_rows
from dslide_workflows.cli import main
from tests.hostile import failed_once

pytest.importorskip("faiss", reason='the output index needs faiss: pip install -e ".[test]"')
PARAMS = {"hidden": (32,), "epochs": 1, "neighbours": 0, "client": False, "random_state": 0}
#: 1,000 labels in 16 lists, 4 probed: a quarter of the rows scanned, as a big model's
#: 12 of 1,024 is not, but the lists are real lists
SMALL = {"lists": 16, "probes": 4, "candidates": 20, "head": 16}


@pytest.fixture(scope="module")
def fitted(tiny):
    train, _ = tiny
    return SlideClassifier(**PARAMS).fit(train.X, train.Y)


@pytest.fixture(scope="module")
def saved(fitted, tmp_path_factory):
    """A saved model folder and a test file of 60 rows."""
    root = tmp_path_factory.mktemp("served")
    fitted.save(str(root / "model"))
    return root


def dense(net: SlideNetwork) -> tuple[np.ndarray, np.ndarray]:
    """The output layer's rows and biases in label order (numpy, no kernel of ours)."""
    order = np.argsort(np.concatenate([s.global_ids(np.arange(s.n_local)) for s in net.shards]))
    W = np.concatenate([s.W for s in net.shards])[order]
    return W, np.concatenate([s.bias for s in net.shards])[order]


@pytest.mark.parametrize("n_shards", [1, 3])
def test_scores_are_the_exact_logits_of_the_labels_returned(tiny, n_shards):
    train, test = tiny
    net = SlideNetwork(
        SlideConfig(hidden=(32,), seed=3), train.n_features, train.n_labels, n_shards=n_shards
    )
    for a in range(0, 2048, 256):
        net.train_step(train.X.slice_rows(a, a + 256), train.Y.slice_rows(a, a + 256))
    index = OutputIndex.build(net.shards, IndexSettings(**SMALL))
    X = test.X.slice_rows(0, 300)
    ids, scores = index.topk_scores(net, X, 5)
    h, _ = net.hidden.forward(X)
    W, b = dense(net)
    logits = h @ W.T + b
    assert (ids >= 0).all() and all(len(set(row)) == 5 for row in ids)
    np.testing.assert_allclose(scores, np.take_along_axis(logits, ids, 1), rtol=1e-5, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_the_head_takes_the_largest_rows_and_the_most_frequent_labels_in_turns():
    sq = np.array([5.0, 1.0, 4.0, 1.0, 3.0, 1.0, 1.0, 1.0])
    counts = np.array([9, 0, 0, 50, 9, 40, 0, 30])
    assert head_rows(sq, None, 3).tolist() == [0, 2, 4]  # by norm alone
    assert head_rows(sq, counts, 4).tolist() == [0, 2, 3, 5]  # 0, 3, 2, 5 in turns
    assert head_rows(sq, counts, 6).tolist() == [0, 2, 3, 4, 5, 7]  # 4 once
    assert head_rows(sq, np.zeros(8, np.int64), 3).tolist() == [0, 2, 4]  # nothing counted


def test_a_layer_of_one_norm_finds_its_frequent_labels_through_the_head():
    """Rows of one norm, the best labels of nearly every query 20 frequent ones (their
    rows lean toward what every query shares, spread over the cells): the norm names
    none of them, the counts do."""
    rng = np.random.default_rng(5)
    n, dim = 4000, 64
    W = rng.standard_normal((n, dim)).astype(np.float32)
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    common = np.abs(rng.standard_normal(dim)).astype(np.float32)
    common /= np.linalg.norm(common)
    frequent = rng.choice(n, 20, replace=False)
    W[frequent] += 0.6 * common
    W[frequent] /= np.linalg.norm(W[frequent], axis=1, keepdims=True)
    net = SlideNetwork(SlideConfig(hidden=(dim,), seed=0), 10, n, n_shards=1)
    net.shards[0].W[:], net.shards[0].bias[:] = W, 0.0
    counts = np.zeros(n, np.int64)
    counts[frequent] = 100
    h = (0.3 * rng.standard_normal((200, dim))).astype(np.float32) + 3 * common
    exact = np.argsort(-(h @ W.T), axis=1)[:, :5]
    assert np.isin(exact, frequent).mean() > 0.95
    settings = IndexSettings(lists=64, probes=2, candidates=10, head=32)
    recall = {}
    for name, given in (("norm", None), ("counts", counts)):
        part = OutputIndex.build(net.shards, settings, given).for_shard(net.shards[0].layout, 0)
        ids, _, _ = part.search(h, net.shards[0].W, net.shards[0].bias, LSHQuery(5))
        recall[name] = recall_at_k(ids, exact)
    assert recall["counts"] >= 0.95 and recall["norm"] <= 0.9, recall


def test_rescoring_keeps_the_best_k_of_the_candidates_once_each():
    rng = np.random.default_rng(0)
    h, W, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (50, 8), (50,)))
    cand = rng.integers(-1, 50, (4, 30))
    cand[0, :4] = 7  # a repeated candidate counts once
    ids, scores = rescore_topk(h, W, b, cand, 3)
    for i in range(4):
        pool = np.unique(cand[i][cand[i] >= 0])
        logits = h[i] @ W[pool].T + b[pool]
        best = pool[np.argsort(-logits)[:3]]
        assert ids[i].tolist() == best.tolist()
        np.testing.assert_allclose(scores[i], np.sort(logits)[::-1][:3], rtol=1e-5)
    few, few_scores = rescore_topk(h, W, b, np.full((4, 2), -1), 3)
    assert (few == -1).all() and np.isneginf(few_scores).all()


def test_dropping_the_index_answers_exactly_again(fitted, tiny):
    _, test = tiny
    X = test.X.slice_rows(0, 200)
    exact = fitted.predict_topk(X, 5, return_scores=True)
    fitted.build_index(**SMALL)
    assert fitted.drop_index().output_index_ is None
    for got, want in zip(fitted.predict_topk(X, 5, return_scores=True), exact, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_classifier_answers_through_its_index_and_saves_it(fitted, saved, tiny):
    _, test = tiny
    X = test.X.slice_rows(0, 400)
    exact_ids, _ = fitted.predict_topk(X, 5, return_scores=True)
    fitted.build_index(**SMALL)
    ids, scores = fitted.predict_topk(X, 5, return_scores=True)
    assert recall_at_k(ids, exact_ids) >= 0.95
    assert fitted.predict(X.slice_rows(0, 1), top_k=5).nnz == 5  # one row
    assert fitted.evaluate(X, test.Y.slice_rows(0, 400))["P@1"] > 0
    url = fitted.save(str(saved / "indexed"))
    for n_shards in (None, 3):  # any shard count: the index is split by label id
        back = SlideClassifier.load(url, n_shards=n_shards)
        assert back.output_index_ is not None
        got_ids, got_scores = back.predict_topk(X, 5, return_scores=True)
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_scores, scores)
    copy = pickle.loads(pickle.dumps(fitted))  # faiss pickles its indexes as their bytes
    np.testing.assert_array_equal(copy.predict_topk(X, 5), ids)


@pytest.mark.slow  # actors on a cluster: 15-20 s on 2 cores
def test_a_model_saved_with_an_index_loads_on_a_cluster(fitted, saved, tiny, client):
    """On a cluster (2 shards, the model was saved with 1) the model answers exactly: its
    rows are in actors, the index is not read."""
    _, test = tiny
    fitted.build_index(**SMALL)
    url = fitted.save(str(saved / "for-cluster"))
    remote = SlideClassifier.load(url, client=client)
    try:
        assert remote.output_index_ is None and remote.trainer_.n_shards == 2
        X = test.X.slice_rows(0, 50)
        want = SlideClassifier.load(url).trainer_.topk(X, 5)
        np.testing.assert_array_equal(remote.predict_topk(X, 5), want)
        with pytest.raises(ValueError, match="on a cluster"):
            remote.build_index()
    finally:
        remote.close()


def test_training_on_drops_the_index(tiny):
    train, test = tiny
    clf = SlideClassifier(**PARAMS).fit(train.X.slice_rows(0, 500), train.Y.slice_rows(0, 500))
    clf.build_index(**SMALL)
    clf.partial_fit(train.X.slice_rows(0, 100), train.Y.slice_rows(0, 100))
    with pytest.warns(UserWarning, match="build_index"):
        clf.predict_topk(test.X.slice_rows(0, 3), 5)
    assert clf.output_index_ is None


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="index setting 'lits'"):
        IndexSettings.of({"lits": 4})
    with pytest.raises(ValueError, match="'codes'"):
        IndexSettings(codes="pq")
    with pytest.raises(ValueError, match="'candidates'"):
        IndexSettings(candidates=0)
    assert IndexSettings().for_rows(670_091).lists == 1024


def test_without_faiss_the_error_says_how_to_install(monkeypatch, fitted):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r'pip install "dslide-dask\[serve\]"'):
        faiss_module()
    with pytest.raises(ImportError, match="serve"):
        fitted.build_index()


# -- files and commands ---------------------------------------------------------------------------
def folder(root: Path) -> Path:
    """The checkpoint folder of a saved model."""
    return root / (root / "LATEST").read_text().strip()


def test_the_commands_build_store_and_use_the_index(saved, tiny, client, capsys):
    from dslide_dask.checkpoint.model import load_network
    from dslide_dask.checkpoint.output_index import load_output_index
    from dslide_dask.checkpoint.store import open_checkpoint
    from dslide_dask.inference import read_predictions

    _, test = tiny
    model = saved / "model"
    write_xc(str(saved / "test.txt"), test.slice(0, 60))
    settings = [a for k, v in SMALL.items() for a in ("--setting", f"{k}={v}")]
    assert main(["index", str(model), *settings]) == 0
    assert "indexed 1,000 labels" in capsys.readouterr().out
    assert (folder(model) / "output_index" / "index.json").exists()
    out = saved / "out"
    code = main(
        [
            "predict",
            str(model),
            str(saved / "test.txt"),
            str(out),
            "--index",
            "--scheduler-address",
            client.scheduler.address,
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "(index)" in capsys.readouterr().out
    ids, scores = read_predictions(str(out))
    ckpt = open_checkpoint(str(model))
    net = load_network(ckpt)
    want_ids, want_scores = load_output_index(ckpt).topk_scores(net, test.X.slice_rows(0, 60), 5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
    assert json.loads((out / "predictions.json").read_text())["output_index"] is True


def test_bench_topk_shows_the_index(saved, tiny, capsys, tmp_path):
    _, test = tiny
    write_xc(str(tmp_path / "test.txt"), test.slice(0, 80))
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "topk",
            "--model",
            str(saved / "model"),
            "--data",
            str(tmp_path / "test.txt"),
            "--setting",
            "0:0",
            "--index-setting",
            "lists=16",
            "--probes",
            "2",
            "--probes",
            "16",
            "--latency-rows",
            "3",
            "--repeat",
            "1",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "plot.png"),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["setting"] for r in rows] == ["exact", "0:0", "index p=2", "index p=16"]
    few, every = rows[2:]
    assert every["recall"] == 1.0 and every["recall@1"] == 1.0  # every list probed
    assert few["recall"] <= every["recall"] and few["bytes"] > 0 and few["build_s"] > 0
    assert "recall@1" in capsys.readouterr().out and (tmp_path / "plot.png").exists()


@pytest.fixture
def two_models(fitted, tiny, tmp_path):
    """Two saved models with an index each: ``(mine, other)`` folders."""
    train, _ = tiny
    fitted.build_index(**SMALL)
    fitted.save(str(tmp_path / "mine"))
    other = SlideClassifier(**{**PARAMS, "random_state": 1}).fit(train.X, train.Y)
    other.build_index(**SMALL).save(str(tmp_path / "other"))
    write_xc(str(tmp_path / "test.txt"), tiny[1].slice(0, 10))
    return tmp_path / "mine", tmp_path / "other"


def _predict(model: Path) -> list[str]:
    return [
        "predict",
        str(model),
        str(model.parent / "test.txt"),
        str(model.parent / "out"),
        "--index",
        "--workers",
        "1",
    ]


def test_a_damaged_index_is_named(two_models, capsys):
    mine, _ = two_models
    blob = folder(mine) / "output_index" / "faiss.npy"
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 8] = b"\xff" * 8
    blob.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="faiss.npy: checksum mismatch"):
        SlideClassifier.load(str(mine))
    line, _ = failed_once(capsys, _predict(mine))
    assert line.startswith("dslide: error: ") and "faiss.npy" in line and "corrupted" in line


def test_a_foreign_index_is_named(two_models, capsys):
    mine, other = two_models
    shutil.rmtree(folder(mine) / "output_index")
    shutil.copytree(folder(other) / "output_index", folder(mine) / "output_index")
    with pytest.raises(CheckpointError, match="index.json: built for another model"):
        SlideClassifier.load(str(mine))
    line, _ = failed_once(capsys, _predict(mine))
    assert "output_index/index.json" in line and "foreign" in line
    shutil.rmtree(folder(mine) / "output_index")  # the model itself loads, without one
    assert SlideClassifier.load(str(mine)).output_index_ is None


def test_index_without_faiss_is_one_line(saved, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "faiss", None)
    line, _ = failed_once(capsys, ["index", str(saved / "model")])
    assert 'pip install "dslide-dask[serve]"' in line

"""Batch inference graphs and the serving LSH top-k, with real parts: a 2-worker
LocalCluster of processes, the local S3 server, the ``dslide`` command line."""

import contextlib
import dataclasses
import importlib.util
import json

import dask.array as da
import fsspec
import numpy as np
import pytest
import scipy.sparse as sp
from dask.utils import key_split

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.checkpoint.model import load_network, save_network
from dslide_dask.checkpoint.store import CheckpointStore, open_checkpoint
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.xc_text import write_xc
from dslide_dask.inference import (
    PredictSpec,
    model_cache,
    predict_topk_scores,
    read_predictions,
    topk_blocks,
)
from dslide_dask.inference.recall import recall_at_k
from dslide_dask.inference.serving import reindex
from dslide_dask.model.lsh_index import LSHQuery, MIPSIndex
from dslide_dask.model.network import SlideNetwork
from dslide_workflows.cli import main
from tests.conftest import BUCKET

CFG = SlideConfig(hidden=(32,), K=3, L=12, range_pow=6, bucket_capacity=16, seed=3)


@pytest.fixture(scope="module")
def tiny():
    return make_synthetic("tiny", seed=0)


@pytest.fixture(scope="module")
def net(tiny):
    train, _ = tiny
    return SlideNetwork(CFG, train.n_features, train.n_labels, n_shards=2)


# -- the serving LSH top-k -------------------------------------------------------------------
def retrieved(shard, h, tables):
    """The local neurons in the first ``tables`` tables' buckets of each row (Python)."""
    buckets = shard.index.buckets(h)
    cap = shard.index.ids.shape[2]
    out = []
    for row in buckets:
        found = set()
        for t in range(tables):
            n = min(shard.index.counts[t, row[t]], cap)
            found.update(shard.index.ids[t, row[t], :n].tolist())
        out.append(found)
    return out


@pytest.mark.parametrize("tables", [1, 4, 12])
def test_lsh_topk_is_the_exact_topk_of_the_retrieved_neurons(net, tiny, tables):
    _, test = tiny
    h, _ = net.hidden.forward(test.X.slice_rows(0, 200))
    shard = net.shards[1]
    ids, scores = shard.topk(h, 5, exact=False, query=LSHQuery(5, tables=tables))
    logits = h @ shard.W.T + shard.bias
    for i, found in enumerate(retrieved(shard, h, tables)):
        local = np.array(sorted(found), np.int64)
        best = local[np.argsort(-logits[i, local], kind="stable")[:5]]
        n = min(5, len(local))
        np.testing.assert_allclose(scores[i, :n], logits[i, best[:n]], rtol=1e-5, atol=1e-5)
        assert set(shard.layout.to_local(ids[i, :n]).tolist()) <= found
        assert (ids[i, n:] == -1).all() and np.isneginf(scores[i, n:]).all()


def test_candidates_cap_scores_at_most_that_many(net, tiny):
    _, test = tiny
    h, _ = net.hidden.forward(test.X.slice_rows(0, 100))
    index, shard = net.shards[0].index, net.shards[0]
    _, scores, n_scored = index.search(h, shard.W, shard.bias, LSHQuery(5, candidates=7))
    assert n_scored.max() <= 7
    everything = index.search(h, shard.W, shard.bias, LSHQuery(5))[2]
    assert (n_scored == np.minimum(everything, 7)).all()


def test_mips_tables_find_more_of_the_exact_topk_than_trainings(tiny):
    train, test = tiny
    params = {k: getattr(CFG, k) for k in ("K", "L", "range_pow", "bucket_capacity", "seed")}
    clf = SlideClassifier(hidden=(32,), epochs=1, lr=1e-2, n_shards=2, **params)
    fresh = clf.fit(train.X, train.Y).trainer_.network
    X = test.X.slice_rows(0, 300)
    exact = predict_topk_scores(fresh, X, PredictSpec("m", k=5))[0]
    lsh = PredictSpec("m", k=5, exact=False)
    before = recall_at_k(predict_topk_scores(fresh, X, lsh)[0], exact)
    reindex(fresh, mips=True)
    after = recall_at_k(predict_topk_scores(fresh, X, lsh)[0], exact)
    assert after > before and after > 0.5, (before, after)


def test_mips_ranges_hold_every_row_once_and_return_true_logits(net, tiny):
    _, test = tiny
    shard = net.shards[0]
    cfg = dataclasses.replace(CFG, bucket_capacity=1024)
    index = MIPSIndex(shard.W, shard.bias, cfg, seed=1, ranges=3)
    held = np.concatenate(
        [
            np.unique(t.ids[0][:, :1024][np.arange(1024) < t.counts[0][:, None]])
            for t in index.ranges
        ]
    )
    assert sorted(held.tolist()) == list(range(shard.n_local))  # table 0 of each range
    h, _ = net.hidden.forward(test.X.slice_rows(0, 50))
    ids, scores, scored = index.search(h, shard.W, shard.bias, LSHQuery(5, candidates=30))
    logits = h @ shard.W.T + shard.bias
    found = ids >= 0
    np.testing.assert_allclose(
        scores[found],
        np.take_along_axis(logits, np.where(found, ids, 0), 1)[found],
        rtol=1e-5,
        atol=1e-5,
    )
    assert (np.diff(scores, axis=1)[np.isfinite(scores[:, 1:])] <= 0).all()
    assert scored.max() <= 30


def test_more_tables_never_lose_recall(net, tiny):
    _, test = tiny
    X = test.X.slice_rows(0, 300)
    exact = predict_topk_scores(net, X, PredictSpec("m", k=5))[0]
    recalls = []
    for tables in (1, 3, 12):
        ids = predict_topk_scores(net, X, PredictSpec("m", k=5, exact=False, tables=tables))[0]
        recalls.append(recall_at_k(ids, exact))
    assert recalls == sorted(recalls) and recalls[-1] > 0


@pytest.mark.parametrize(
    "bad", [{"k": 0}, {"tables": -1}, {"candidates": -2}, {"k": 2.5}, {"k": True}]
)
def test_bad_query_settings_are_named(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        PredictSpec("m", **bad)


# -- graphs on a cluster, from and to S3 -------------------------------------------------------
@pytest.fixture(scope="module")
def on_s3(s3, net, tiny):
    """The model and the test split (3 part files) on the local S3 server."""
    _, test = tiny
    root = f"s3://{BUCKET}/infer"
    ckpt = save_network(CheckpointStore(f"{root}/model", s3), net)
    bounds = [0, 300, 650, test.n_points]
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        write_xc(f"{root}/test/part-{j}.txt", test.slice(a, b), s3)
    return root, ckpt.url


def s3_flags(so):
    return [
        "--storage-option",
        f"key={so['key']}",
        "--storage-option",
        f"secret={so['secret']}",
        "--storage-option",
        f"client_kwargs.endpoint_url={so['client_kwargs']['endpoint_url']}",
    ]


@contextlib.contextmanager
def stream(client):
    from distributed import get_task_stream

    with get_task_stream(client) as ts:
        yield ts


WAYS = {
    "exact": ([], {}),
    "lsh": (
        ["--lsh", "--tables", "6", "--candidates", "40"],
        {"exact": False, "tables": 6, "candidates": 40},
    ),
    "mips": (
        ["--lsh", "--mips", "--table", "L=16", "--table", "ranges=3", "--candidates", "30"],
        {"exact": False, "candidates": 30, "mips": True, "index": (("L", 16), ("ranges", 3))},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("way", list(WAYS))
def test_predict_cli_on_s3_equals_one_process(client, s3, on_s3, tiny, way, capsys):
    root, model = on_s3
    _, test = tiny
    out = f"{root}/out-{way}"
    flags, settings = WAYS[way]
    argv = ["predict", f"{root}/model", f"{root}/test", out, "--k", "5", *flags]
    argv += ["--scheduler-address", client.scheduler.address, "--no-progress", *s3_flags(s3)]
    with stream(client) as ts:
        code = main(argv)
    assert code == 0, capsys.readouterr().err
    ids, scores = read_predictions(out, s3)
    spec = PredictSpec(model, k=5, **settings)
    reference = load_network(open_checkpoint(model, s3))
    reindex(reference, spec.mips, **dict(spec.index))
    want_ids, want_scores = predict_topk_scores(reference, test.X, spec)
    assert ids.shape == (test.n_points, 5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    names = {key_split(t["key"]) for t in ts.data}
    assert {"read-rows", "hidden", "shard-topk", "merge-write", "write-manifest"} <= names
    loads = client.run(lambda: model_cache.loads)
    assert all(n <= len(WAYS) - 1 for n in loads.values())  # once per model and tables
    assert "rows/s" in capsys.readouterr().out
    assert len(fsspec.filesystem("s3", **s3).ls(out)) == 4  # 3 parts and the manifest


@pytest.mark.slow
def test_dask_array_topk_equals_one_process(client, s3, on_s3, tiny):
    _, model = on_s3
    _, test = tiny
    X = test.X.slice_rows(0, 500)
    rows = sp.csr_matrix((X.values(), X.indices, X.indptr), shape=X.shape)
    dX = da.from_array(rows, chunks=(128, X.n_cols), asarray=False)
    spec = PredictSpec(model, k=3, storage_options=s3)
    got = topk_blocks(dX, spec).compute()
    want = predict_topk_scores(load_network(open_checkpoint(model, s3)), X, spec)[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["missing-model", "TEST", "OUT"], "no checkpoint here"),
        (["MODEL", "TEST", "OUT", "--k", "0"], "--k"),
        (["MODEL", "TEST", "OUT", "--k", "100000"], "k must be at most"),
        (["MODEL", "OTHER", "OUT"], "features, the model"),
        (["MODEL", "TEST", "OUT", "--lsh", "--tables", "-1"], "tables"),
        (["MODEL", "TEST", "OUT", "--lsh", "--table", "lr=1"], "index setting 'lr'"),
        (["MODEL", "TEST", "OUT", "--lsh", "--table", "L=0"], "L must be"),
        (["MODEL", "TEST", "OUT", "--lsh", "--mips", "--table", "ranges=0"], "'ranges' must"),
        (["MODEL", "TEST", "OUT", "--lsh", "--table", "ranges=2"], "(--mips) only"),
    ],
)
def test_bad_input_is_one_line(tmp_path, net, tiny, args, says, capsys):
    _, test = tiny
    model = save_network(CheckpointStore(str(tmp_path / "model")), net).url
    write_xc(str(tmp_path / "test.txt"), test.slice(0, 10))
    few = test.slice(0, 10)
    wide = XCDataset(dataclasses.replace(few.X, n_cols=few.n_features + 5), few.Y)
    write_xc(str(tmp_path / "other.txt"), wide)
    names = {
        "MODEL": model,
        "TEST": str(tmp_path / "test.txt"),
        "OTHER": str(tmp_path / "other.txt"),
        "OUT": str(tmp_path / "out"),
        "missing-model": str(tmp_path / "nothing"),
    }
    try:
        code = main(["predict", *[names.get(a, a) for a in args], "--workers", "1"])
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert "Traceback" not in err[0]


def test_recall_at_k_counts_shared_ids_and_not_missing_ones():
    exact = np.array([[1, 2, 3], [4, 5, 6]])
    found = np.array([[3, 1, 9], [-1, -1, 6]])
    assert recall_at_k(found, exact) == pytest.approx((2 / 3 + 1 / 3) / 2)


def test_bench_topk_reports_recall_and_speed_per_setting(tmp_path, net, tiny, capsys):
    _, test = tiny
    model = save_network(CheckpointStore(str(tmp_path / "model")), net).url
    write_xc(str(tmp_path / "test.txt"), test.slice(0, 120))
    out = tmp_path / "bench.json"
    argv = ["bench", "topk", "--model", model, "--data", str(tmp_path / "test.txt")]
    argv += ["--setting", "0:0", "--setting", "4:20", "--mips", "--table", "L=16", "--no-index"]
    argv += ["--latency-rows", "5", "--repeat", "1", "--json", str(out)]
    code = main(argv)
    assert code == 0
    result = json.loads(out.read_text())
    assert [r["setting"] for r in result["results"]] == ["exact", "0:0", "4:20"]
    exact, full, cut = result["results"]
    assert exact["recall"] == 1.0 and 0 < cut["recall"] <= full["recall"] <= 1
    assert cut["scored_per_row"] <= 20 * len(net.shards)  # C is per shard
    assert all(r["rows_per_s"] > 0 for r in result["results"])
    assert result["table"] == {"L": 16} and result["mips"] is True
    assert "recall@5" in capsys.readouterr().out


def test_bench_topk_anchors_the_network_on_label_trees_trained_on_its_rows(
    tmp_path, net, tiny, capsys
):
    installed = [name for name in ("omikuji", "napkinxc") if importlib.util.find_spec(name)]
    if not installed:
        pytest.skip("no label-tree library installed (pip install -e '.[bench-trees]')")
    train, test = tiny
    model = save_network(CheckpointStore(str(tmp_path / "model")), net).url
    write_xc(str(tmp_path / "train.txt"), train)
    write_xc(str(tmp_path / "test.txt"), test.slice(0, 120))
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "topk", "--model", model, "--data", str(tmp_path / "test.txt")]
    argv += ["--setting", "0:0", "--no-index", "--trees", str(tmp_path / "train.txt")]
    argv += ["--latency-rows", "5", "--repeat", "1", "--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    exact, _, *trees = json.loads(out.read_text())["results"]
    assert [t["setting"] for t in trees] == installed
    printed = capsys.readouterr().out
    for t in trees:
        assert t["anchor"] is True
        assert t["recall"] != t["recall"]  # NaN: the trees do not retrieve the network's
        assert t["P@1"] > exact["P@1"] + 0.2  # trained trees against an untrained network
        assert t["rows_per_s"] > 0 and t["latency_ms_p50"] > 0 and t["build_s"] > 0
        assert t["setting"] in printed
    assert png.stat().st_size > 0


@pytest.mark.parametrize(
    ("where", "message"), [("s3://bucket/train.txt", "local files only"), ("nope.txt", "no such")]
)
def test_bench_topk_trees_must_be_a_local_file(where, message):
    from dslide_workflows.bench.tree_anchors import local_text

    with pytest.raises(ValueError, match=message):
        local_text(where)


def test_shard_task_scores_in_batches_as_one_call(tmp_path, net, tiny):
    from dslide_dask.inference import tasks

    _, test = tiny
    model = save_network(CheckpointStore(str(tmp_path / "model")), net).url
    spec = PredictSpec(model, k=4)
    h, _ = net.hidden.forward(test.X.slice_rows(0, 300))
    whole = tasks.shard_topk(spec, h, 1)
    np.testing.assert_array_equal(tasks.shard_topk(spec, h, 1, batch_size=64)[0], whole[0])
    np.testing.assert_array_equal(whole[0], net.shards[1].topk(h, 4)[0])


def test_a_run_folder_means_its_final_model_over_its_latest_checkpoint(tmp_path, net):
    run = tmp_path / "run"
    save_network(CheckpointStore(str(run / "checkpoints")), net, extra={"which": "checkpoint"})
    assert model_cache.resolve(str(run)).meta["which"] == "checkpoint"
    save_network(CheckpointStore(str(run / "model")), net, extra={"which": "model"})
    assert model_cache.resolve(str(run)).meta["which"] == "model"


def test_reading_an_incomplete_prediction_folder_names_its_manifest(tmp_path):
    (tmp_path / "part-000000.npz").write_bytes(b"x")
    with pytest.raises(ValueError, match="predictions.json: not found"):
        read_predictions(str(tmp_path))

"""One model everywhere: ``dslide train`` from files (local or the local S3 server) on a
real LocalCluster builds the whole model, its neighbours, label centroids and trees on a
worker from the rows it reads there, saves it whole, and ``SlideClassifier.load`` and
``dslide predict`` answer with it; the rows held out of the network's training to weigh
the parts are the same rows in the coordinator's stream and on the building worker."""

import json
import time

import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.data.batches import plan
from dslide_dask.data.held import HeldRows, read_split
from dslide_dask.data.stream import Stream
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.xc_text import write_xc
from dslide_dask.inference import read_predictions
from dslide_dask.metrics import xc_metrics
from dslide_dask.model.fused_build import FUSION_DEFAULTS
from dslide_workflows.cli import main
from tests.conftest import BUCKET, no_pairs


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    train, test = make_synthetic("tiny", seed=0)
    root = tmp_path_factory.mktemp("data")
    write_xc(str(root / "train.txt"), train)
    write_xc(str(root / "test.txt"), test)
    return root, train, test


def test_the_stream_and_the_builder_hold_out_the_same_rows(files):
    root, train, _ = files
    source = plan(str(root / "train.txt"))
    held = HeldRows(0.1, seed=3)
    kept, out = read_split(source, held)
    assert abs(out.n_points - 0.1 * train.n_points) < 0.03 * train.n_points
    assert kept.n_points + out.n_points == train.n_points
    streamed = list(Stream(64, seed=1, held=held).batches(source))
    rows = {
        tuple(b.X.indices[b.X.indptr[i] : b.X.indptr[i + 1]])
        for _, _, b in streamed
        for i in range(b.n_points)
    }  # noqa: E501
    assert sum(b.n_points for _, _, b in streamed) == kept.n_points
    assert rows == {
        tuple(kept.X.indices[kept.X.indptr[i] : kept.X.indptr[i + 1]]) for i in range(kept.n_points)
    }  # noqa: E501
    in_memory, held_in_memory = read_split(train, held)  # rows in memory: by row number
    assert in_memory.n_points + held_in_memory.n_points == train.n_points


def test_the_fusion_defaults_are_the_estimators():
    params = SlideClassifier().get_params()
    assert {k: params[k] for k in FUSION_DEFAULTS} == FUSION_DEFAULTS


def _train(argv, client, capsys) -> tuple[str, str]:
    code = main(["train", *argv, "--scheduler-address", client.scheduler.address, "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out, out.err


def _p1(out: str, prefix: str = "test") -> float:
    line = next(line for line in out.splitlines() if line.strip().startswith(prefix))
    return float(line.split("P@1")[1].split()[0])


def test_train_from_files_builds_saves_and_serves_the_whole_model(files, client, capsys):
    root, train, test = files
    argv = ["--train", str(root / "train.txt"), "--test", str(root / "test.txt")]
    argv += ["--epochs", "2", "--run-dir", str(root / "run"), "--eval-points", "100000"]
    out, _ = _train(argv, client, capsys)
    assert "building the neighbours, label centroids and trees on a worker" in out
    # each stage, told by the building worker as it is done, in order
    stages = ["  read 5,000 rows", "  weights chosen on", "1 label tree", "  hidden vectors"]
    assert all(stage in out for stage in stages), out
    assert sorted(stages, key=out.index) == stages
    fused_p1, network_p1 = _p1(out), float(out.split("network P@1")[1].split()[0])
    assert fused_p1 > network_p1 + 0.1, out  # the fused parts count
    model = str(root / "run" / "model")
    meta = json.loads(next((root / "run" / "model").rglob("meta.json")).read_text())
    assert meta["fusion"]["neighbours"] == FUSION_DEFAULTS["neighbours"]
    loaded = SlideClassifier.load(model)  # the Python API answers with the same model
    assert loaded.neighbours_ is not None and loaded.neighbours_.trees
    api_top = loaded.predict_topk(test.X, 5)
    assert abs(xc_metrics(api_top, test.Y, (1,))["P@1"] - fused_p1) < 0.005
    code = main(["predict", model, str(root / "test.txt"), str(root / "out"), "--k", "5",
                 "--scheduler-address", client.scheduler.address, "--no-progress"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    np.testing.assert_array_equal(read_predictions(str(root / "out"))[0], api_top)
    # saved in pieces by the workers that hold the trees, loaded in pieces on a cluster
    assert next((root / "run" / "model").rglob("tree_p1_nodes.npy"), None) is not None
    remote = SlideClassifier.load(model, client=client)
    assert remote._fused_parts.shards  # the trees' pieces dealt over the workers
    assert (remote.predict_topk(test.X, 5) == api_top).mean() > 0.99  # sums' order aside
    remote._fused_parts.close()
    # beside the same rows fitted in memory by the Python API, on the same cluster
    clf = SlideClassifier(epochs=2, client=client, random_state=0).fit(train.X, train.Y)
    api = clf.evaluate(test.X, test.Y)["P@1"]
    assert fused_p1 > api - 0.05, (fused_p1, api)


def test_neighbours_0_trains_the_network_alone(files, client, capsys):
    root, _, _ = files
    argv = ["--train", str(root / "train.txt"), "--test", str(root / "test.txt")]
    argv += ["--run-dir", str(root / "alone"), "--opt", "neighbours=0"]
    out, _ = _train(argv, client, capsys)
    assert "network P@1" not in out and "building the neighbours" not in out
    assert not list((root / "alone" / "model").rglob("neighbours"))


@pytest.mark.parametrize(
    ("opt", "says"),
    [("label_tree=3", "label_tree must be"), ("neighbour_mix=x", "neighbour_mix must be")],
)
def test_a_bad_fusion_parameter_is_one_line(files, opt, says, capsys):
    root, _, _ = files
    argv = ["train", "--train", str(root / "train.txt"), "--opt", opt, "--in-process"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.slow
def test_train_from_s3_builds_the_whole_model_on_a_worker(files, client, s3, capsys):
    import fsspec

    root, _, test = files
    fs = fsspec.filesystem("s3", **s3)
    for name in ("train.txt", "test.txt"):
        fs.put(str(root / name), f"{BUCKET}/fused/{name}")
    flags = ["--storage-option", "key=testing", "--storage-option", "secret=testing",
             "--storage-option",
             f"client_kwargs.endpoint_url={s3['client_kwargs']['endpoint_url']}"]  # fmt: skip
    argv = ["--train", f"s3://{BUCKET}/fused/train.txt", "--test", f"s3://{BUCKET}/fused/test.txt"]
    argv += ["--epochs", "2", "--run-dir", f"s3://{BUCKET}/fused/run", "--eval-points", "100000"]
    out, _ = _train([*argv, *flags], client, capsys)
    local = _p1(out)
    loaded = SlideClassifier.load(f"s3://{BUCKET}/fused/run/model", storage_options=s3)
    assert loaded.neighbours_ is not None
    assert abs(xc_metrics(loaded.predict_topk(test.X, 5), test.Y, (1,))["P@1"] - local) < 0.005


def _dask(csr, rows: int):
    import dask.array as da
    import scipy.sparse as sp

    matrix = sp.csr_matrix((csr.values(), csr.indices, csr.indptr), shape=csr.shape)
    return da.from_array(matrix, chunks=(rows, csr.shape[1]), asarray=False)


def test_a_fit_from_a_url_on_a_cluster_is_the_whole_model(files, client, tmp_path):
    root, _, test = files
    clf = SlideClassifier(epochs=2, client=client, random_state=0).fit(str(root / "train.txt"))
    assert clf.fused_model() is None  # built on a worker, never brought here
    scores = clf.evaluate(test.X, test.Y)
    fused = scores["P@1"]
    assert fused > clf.trainer_.evaluate(test)["P@1"] + 0.1  # the network alone's
    kept = clf.evaluate(test.X, test.Y, exclude=no_pairs(len(test), test.n_labels))
    assert kept == pytest.approx({name: scores[name] for name in kept})  # counts from the worker
    top = clf.predict_topk(test.X, 5)
    assert abs(xc_metrics(top, test.Y, (1,))["P@1"] - fused) < 1e-9
    blocks = clf.predict_topk(_dask(test.X, 400), 5)  # each block answered on that worker
    np.testing.assert_array_equal(blocks.compute(), top)
    url = clf.save(str(tmp_path / "model"))  # the fused parts written by their worker
    loaded = SlideClassifier.load(url)
    assert loaded.neighbours_ is not None and loaded.neighbour_weight_ == clf.neighbour_weight_
    assert abs(loaded.evaluate(test.X, test.Y)["P@1"] - fused) < 0.01  # float16 on the wire
    remote = SlideClassifier.load(url, client=client)  # onto the cluster: read by a worker
    assert remote.neighbours_ is None and remote.neighbour_weight_ == clf.neighbour_weight_
    assert abs(remote.evaluate(test.X, test.Y)["P@1"] - fused) < 0.01
    remote.close()
    key = clf._fused_parts.future.key
    clf.close()  # the fused parts go from their worker with the actors

    def held() -> bool:
        return any(key in keys for keys in client.has_what().values())

    deadline = time.monotonic() + 30  # the release is a message: wait for it, bounded
    while held() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not held()


@pytest.mark.slow
def test_a_fit_of_dask_arrays_on_a_cluster_is_the_whole_model(files, client):
    _, train, test = files
    X, Y = _dask(train.X, 1000), _dask(train.Y, 1000)
    clf = SlideClassifier(epochs=2, client=client, random_state=0).fit(X, Y)
    scores = clf.evaluate(_dask(test.X, 300), _dask(test.Y, 300))  # each block scored apart
    assert scores["P@1"] > clf.trainer_.evaluate(test)["P@1"] + 0.1
    whole = clf.evaluate(test.X, test.Y)
    assert scores == pytest.approx({name: whole[name] for name in scores}, abs=1e-9)  # PSP@k too
    clf.close()


@pytest.mark.slow
def test_a_fit_from_a_url_in_process_builds_the_same_recipe_here(files):
    root, _, test = files
    clf = SlideClassifier(epochs=2, client=False, random_state=0).fit(str(root / "train.txt"))
    assert clf.fused_model() is not None and clf.fused_model().index.trees
    assert clf.evaluate(test.X, test.Y)["P@1"] > clf.trainer_.evaluate(test)["P@1"] + 0.1


def test_a_model_loaded_onto_a_cluster_to_answer_reads_no_optimiser_state(files, client, tmp_path):
    """``load(url, client, answering=True)``: every shard and the hidden layer restored
    without their Adam moments, the same answers, and no training or saving."""
    from dslide_dask.errors import NetworkAloneWarning

    _, train, test = files
    clf = SlideClassifier(hidden=(32,), epochs=1, client=False, random_state=0)
    url = clf.fit(train.X, train.Y).save(str(tmp_path / "model"))
    whole = SlideClassifier.load(url, client=client)
    answering = SlideClassifier.load(url, client=client, answering=True)
    np.testing.assert_array_equal(answering.predict_topk(test.X, 5), whole.predict_topk(test.X, 5))

    def moments_held(model_id: str, n_shards: int) -> bool:  # on a worker
        from dslide_dask.distributed.registry import COORDINATOR, lookup
        from dslide_dask.model.optimizer import is_moment

        states = []
        for part in (COORDINATOR, *range(n_shards)):
            try:
                held = lookup(model_id, part)
            except LookupError:  # another worker's
                continue
            if part != COORDINATOR:
                states.append(held.shard.state()[0])
            if held.hidden is not None:  # the hidden stack, or this shard's slice of it
                states.append(held.hidden.state())
        return any(v.any() for state in states for k, v in state.items() if is_moment(k))

    for model, expected in ((whole, True), (answering, False)):
        trainer = model.trainer_
        n = len(trainer.placement.workers)
        held = client.run(moments_held, trainer._model_id, n)
        assert any(held.values()) is expected, held
    refusal = "loaded to answer only .*answering=False"
    with pytest.raises(ValueError, match=refusal), pytest.warns(NetworkAloneWarning):
        answering.partial_fit(train.X[:64], train.Y[:64])
    with pytest.raises(ValueError, match=refusal):
        answering.save(str(tmp_path / "again"))
    whole.close()
    answering.close()


def test_a_tree_kept_in_pieces_on_the_workers_scores_and_saves_as_one(files, client, tmp_path):
    from dslide_dask.checkpoint.tree_pieces import joined_trees
    from dslide_dask.distributed.tree_shards import ShardNodes, ShardTrees, start_shards
    from dslide_dask.model.label_tree import LabelTree
    from dslide_dask.model.neighbours import NeighbourIndex
    from dslide_dask.model.tree_serving import forest_topk_losses
    from dslide_dask.model.tree_shards import unit_query

    _, train, test = files
    index = NeighbourIndex.build(train.X, train.Y).with_centroids()
    args = (index._rows(), index.y_ptr, index.y_idx, index.centroids, 7)
    here = LabelTree.build(*args)
    shards = start_shards(client, sorted(client.scheduler_info()["workers"]))
    actors = [shard.result() for shard in shards]
    shape = LabelTree.build(*args, ShardNodes(actors))
    held = [actor.assemble((shape,)).result() for actor in actors]
    assert min(held) > 0  # each worker keeps a share of the weights
    assert sum(held) == here.w_feature.nbytes + here.w_val.nbytes
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, train.n_labels, (test.n_points, 20))
    scores = rng.random(ids.shape).astype(np.float32)
    pieces = ShardTrees(actors).topk_losses(test.X, ids, scores, power=0.5, k=5)
    whole = forest_topk_losses((here,), unit_query(test.X), ids, scores, 0.5, 5)
    scored = np.isfinite(whole)  # the pieces score these leaves and perhaps a few more
    np.testing.assert_allclose(pieces[scored], whole[scored], rtol=1e-5)
    entries: dict = {}
    for p, actor in enumerate(actors):
        entries.update(actor.save(str(tmp_path), p, None).result())
    folder = tmp_path / "neighbours"
    whole = joined_trees({name: np.load(folder / f"{name}.npy") for name in entries})
    for name, array in here.state().items():
        np.testing.assert_array_equal(whole[f"tree_{name}"], array, err_msg=name)
    for shard in shards:
        shard.release()


def test_plan_counts_the_fused_parts_on_the_worker_that_builds_them(capsys):
    assert main(["plan", "--preset", "tiny", "--workers", "2", "--opt", "neighbours=10"]) == 0
    out = capsys.readouterr().out
    assert "fused parts: " in out and "on the last worker, and " in out
    assert "of label trees in pieces over the workers (from the preset's averages" in out
    last = [line for line in out.splitlines() if line.startswith("local-worker-1")][0]
    assert float(last.split()[-3]) > 0  # the fused column of the building worker
    assert main(["plan", "--preset", "tiny", "--workers", "2", "--opt", "neighbours=0"]) == 0
    assert "fused parts" not in capsys.readouterr().out


def test_the_builder_takes_the_threads_of_the_model_workers_on_its_host(client):
    from dslide_dask.distributed.fused_worker import idle_threads
    from dslide_dask.distributed.liveness import workers_now

    info = workers_now(client)
    workers = sorted(info)
    every = sum(int(info[w]["nthreads"]) for w in workers)  # one host: a LocalCluster
    assert idle_threads(client, workers, workers[-1]) == every
    assert idle_threads(client, workers[-1:], workers[-1]) == info[workers[-1]]["nthreads"]

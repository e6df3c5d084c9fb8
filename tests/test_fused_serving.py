"""One model everywhere: a model saved with its fused parts (neighbours, label centroids
and trees) is answered whole by ``dslide predict`` and the prediction graphs on a real
LocalCluster, as ``SlideClassifier.load(...).predict_topk`` answers it in one process."""

import logging
import os

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

from dslide_dask import SlideClassifier
from dslide_dask.checkpoint.model import load_network
from dslide_dask.checkpoint.neighbours import stored_bytes
from dslide_dask.checkpoint.store import open_checkpoint
from dslide_dask.data.csr import CSR
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.xc_text import write_xc
from dslide_dask.distributed.memory_plan import RUNTIME_BYTES
from dslide_dask.inference import PredictSpec, predict_topk_scores, read_predictions, topk_blocks
from dslide_dask.inference.worker_memory import FUSED_SERVED, worker_bytes
from dslide_dask.metrics import xc_metrics
from dslide_dask.model.optimizer import is_moment
from dslide_workflows.cli import describe, main

PARAMS = dict(hidden=(32,), K=3, L=10, range_pow=8, lr=1e-2, batch_size=128, random_state=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A fused model (label tree on) saved, and 600 test rows in two part files."""
    train, test = make_synthetic("tiny", seed=0)
    test = test.slice(0, 600)
    root = tmp_path_factory.mktemp("fused")
    clf = SlideClassifier(epochs=2, label_tree=0.5, client=False, **PARAMS)
    clf.fit(train.X, train.Y)
    url = clf.save(str(root / "model"))
    (root / "test").mkdir()
    write_xc(str(root / "test" / "part-0.txt"), test.slice(0, 250))
    write_xc(str(root / "test" / "part-1.txt"), test.slice(250, 600))
    return root, url, test


def test_predict_answers_with_the_whole_model(client, saved, capsys):
    root, url, test = saved
    loaded = SlideClassifier.load(url)
    assert loaded.fused_model() is not None and loaded.neighbours_.trees
    want_ids, want_scores = loaded.predict_topk(test.X, 5, return_scores=True)
    argv = ["predict", str(root / "model"), str(root / "test"), str(root / "out"), "--k", "5"]
    code = main([*argv, "--scheduler-address", client.scheduler.address, "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert "(fused; " in capsys.readouterr().out
    ids, scores = read_predictions(str(root / "out"))
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    network = predict_topk_scores(load_network(open_checkpoint(url)), test.X, PredictSpec(url))
    fused_p1 = xc_metrics(ids, test.Y, (1,))["P@1"]
    assert fused_p1 > xc_metrics(network[0], test.Y, (1,))["P@1"]  # the fused parts count

    argv = [*argv[:3], str(root / "alone"), "--k", "5", "--network-only"]
    code = main([*argv, "--scheduler-address", client.scheduler.address, "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert "(exact)" in capsys.readouterr().out  # not fused
    np.testing.assert_array_equal(read_predictions(str(root / "alone"))[0], network[0])


def test_a_dask_array_is_answered_with_the_whole_model(client, saved):
    _, url, test = saved
    X = test.X
    rows = sp.csr_matrix((X.values(), X.indices, X.indptr), shape=X.shape)
    dX = da.from_array(rows, chunks=(200, X.n_cols), asarray=False)
    got = topk_blocks(dX, PredictSpec(url, k=5)).compute()
    np.testing.assert_array_equal(got, SlideClassifier.load(url).predict_topk(X, 5))


def test_a_worker_serves_the_fused_parts_through_their_indexes_as_the_estimator(
    tmp_path, monkeypatch
):
    """``dslide predict --index``'s task (one worker's model, loaded once) answers as the
    estimator after ``build_index``: the network through its output index, the input's
    votes from the serving postings, the hidden votes through the points' search."""
    from dslide_dask.inference import model_cache, tasks
    from dslide_dask.model import fused

    monkeypatch.setattr(fused, "MIN_POINTS", 1000)  # the tiny preset's 4,500 points
    train, test = make_synthetic("tiny", seed=0)
    clf = SlideClassifier(epochs=1, neighbour_weight=(0.3, 0.3), client=False, **PARAMS)
    clf.fit(train.X, train.Y).build_index(lists=16, probes=8)
    url = clf.save(str(tmp_path / "model"))
    X = test.X.slice_rows(0, 300)
    want = SlideClassifier.load(url).predict_topk(X, 5, return_scores=True)
    spec = PredictSpec(url, k=5, exact=False, output_index=True)
    loads = model_cache.loads
    got = tasks.fused_topk_scores(spec, X)
    parts = model_cache.fused(spec)
    assert parts.index.serving is not None and parts.index.search is not None
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    tasks.fused_topk_scores(spec, X.slice_rows(0, 10))
    assert model_cache.loads == loads + 1  # loaded once, served twice


def test_a_worker_does_not_read_a_network_the_fused_parts_never_ask(tmp_path):
    from dslide_dask.inference import model_cache, tasks

    train, test = make_synthetic("tiny", seed=0)
    clf = SlideClassifier(epochs=1, neighbour_weight=(1.0, 0.0), client=False, **PARAMS)
    url = clf.fit(train.X, train.Y).save(str(tmp_path / "model"))
    X = test.X.slice_rows(0, 200)
    X = CSR(np.append(X.indptr, X.indptr[-1]), X.indices, X.data, X.n_cols)  # + a row of no words
    want = SlideClassifier.load(url).predict_topk(X, 5, return_scores=True)
    spec = PredictSpec(url, k=5)
    got = tasks.fused_topk_scores(spec, X)
    assert model_cache.served(spec)[0] is None  # the output layer was never read
    np.testing.assert_array_equal(got[0], want[0])
    frequent = np.argsort(-np.bincount(train.Y.indices, minlength=train.n_labels), kind="stable")
    np.testing.assert_array_equal(got[0][-1], frequent[:5])  # no neighbour: still 5 answers
    assert (got[0] >= 0).all()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    assert model_cache.model(spec).n_labels == train.n_labels  # read when asked
    arrays = open_checkpoint(url).meta["arrays"].items()
    network_bytes = sum(e["bytes"] for name, e in arrays if not is_moment(name))
    ckpt = open_checkpoint(url)
    alone, fused = worker_bytes(ckpt, PredictSpec(url, fused=False)), worker_bytes(ckpt, spec)
    assert alone == RUNTIME_BYTES + network_bytes  # no fused parts, the network's weights
    served = round(FUSED_SERVED * sum(stored_bytes(url).values()))
    assert fused == RUNTIME_BYTES + served  # the fused parts as served; the network not asked


def test_a_worker_too_small_for_the_model_is_refused_before_any_task(saved, capsys):
    """A worker whose memory limit the model would overfill (Dask would pause it for ever
    or its nanny restart it: KilledWorker) is named in one line, before a task runs."""
    from distributed import Client, LocalCluster

    root, url, test = saved
    need = worker_bytes(open_checkpoint(url), PredictSpec(url))
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
        memory_limit=int(0.9 * need), silence_logs=logging.ERROR,
    ) as cluster:  # fmt: skip
        argv = ["predict", str(root / "model"), str(root / "test"), str(root / "small")]
        code = main([*argv, "--scheduler-address", cluster.scheduler_address, "--no-progress"])
        with Client(cluster), pytest.raises(ValueError, match="has a memory limit of"):
            topk_blocks(da.zeros((10, test.n_features), chunks=5), PredictSpec(url))
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert f"each worker needs about {need / 2**30:.2f} GiB" in err
    assert "has a memory limit of" in err and "Traceback" not in err
    assert not (root / "small").exists() or not list((root / "small").glob("part-*"))


def _die() -> None:
    os._exit(1)  # as the nanny's kill of a worker over its memory limit ends it


def test_a_task_that_kills_its_workers_is_one_line_not_an_internal_error():
    """Should a worker die anyway (its memory, a crash), the command says which task, how
    many workers it took and where to look, exit 1: not "internal error ... report it"."""
    import dask
    from distributed import Client, KilledWorker, LocalCluster

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        ) as cluster,
        Client(cluster) as client,
        pytest.raises(KilledWorker) as caught,
    ):  # fmt: skip
        client.submit(_die, key="die-0").result()
    text, code = describe(caught.value)
    assert code == 1 and "internal error" not in text
    assert text.startswith("task 'die-0' ended the worker that ran it (tcp://")
    assert "memory limit" in text and "logs" in text

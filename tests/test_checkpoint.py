"""Checkpoints: format, atomic commits, corruption, re-sharding, resume (in one process)."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from dslide_dask import SlideClassifier, SlideConfig
from dslide_dask.checkpoint import (
    CheckpointError,
    CheckpointPolicy,
    CheckpointStore,
    open_checkpoint,
)
from dslide_dask.data.stream import Stream
from dslide_dask.errors import NetworkAloneWarning
from dslide_dask.local_trainer import LocalTrainer

CFG = SlideConfig(hidden=(32,), K=3, L=10, range_pow=8, min_active=100, max_active=400)


def trainer(tiny, cfg: SlideConfig = CFG, **kw) -> LocalTrainer:
    train, _ = tiny
    return LocalTrainer(cfg, train.n_features, train.n_labels, **kw)


def test_checkpoints_every_n_steps_keep_the_newest(tiny, tmp_path):
    train, _ = tiny
    policy = CheckpointPolicy(str(tmp_path), every_steps=10, keep=2)
    t = trainer(tiny, checkpoint=policy)
    t.train(train.slice(0, 64 * 35), Stream(64))
    store = CheckpointStore(str(tmp_path))
    assert len(store.list()) == 2  # steps 20 and 30; 10 pruned
    latest = store.latest()
    assert latest.step == 30
    assert latest.meta["position"] == {"epoch": 0, "batch": 30}
    assert [r.get("checkpoint") is not None for r in t.history].count(True) == 3
    # plain arrays and JSON: no pickle anywhere
    files = {p.suffix for p in tmp_path.rglob("*") if p.is_file()}
    assert files <= {".npy", ".json", ""}, files
    for npy in tmp_path.rglob("*.npy"):
        np.load(npy, allow_pickle=False)


def test_saved_model_predicts_the_same_under_any_sharding(tiny, tmp_path):
    train, test = tiny
    t = trainer(tiny, n_shards=3)
    t.train(train, Stream(64))
    before = t.topk(test.X, 5)
    t.save(str(tmp_path / "model"))
    ckpt = open_checkpoint(str(tmp_path / "model"))
    for n_shards in (1, 2, 3, 4):
        again = trainer(tiny, n_shards=n_shards, restore=ckpt)
        np.testing.assert_array_equal(again.topk(test.X, 5), before)
        assert again.step == t.step


def test_a_network_loaded_to_answer_answers_the_same_without_its_moments(tiny, tmp_path):
    """``load_network(answering=True)`` (what a prediction's worker loads) reads no Adam
    moment, and answers as the whole network does."""
    from dslide_dask.checkpoint.model import load_network
    from dslide_dask.model.optimizer import is_moment

    train, test = tiny
    cfg = dataclasses.replace(CFG, beta1=0.9)  # first moments kept too
    t = trainer(tiny, cfg, n_shards=2)
    t.train(train.slice(0, 64 * 20), Stream(64))
    t.save(str(tmp_path / "model"))
    ckpt = open_checkpoint(str(tmp_path / "model"))
    whole, answering = load_network(ckpt), load_network(ckpt, answering=True)
    for net in (whole, answering):
        np.testing.assert_array_equal(net.topk(test.X, 5), t.topk(test.X, 5))
    state = answering.hidden.state()
    moments = [name for name in state if is_moment(name)]
    assert moments and all(not state[name].any() for name in moments)
    assert any(whole.hidden.state()[name].any() for name in moments)
    for shard in answering.shards:
        rows, _ = shard.state()
        assert not rows["W.v"].any() and not rows["W.m"].any()
        assert rows["W"].any()


@pytest.mark.parametrize(
    "stop_at, dropout, beta1", [(40, 0.0, 0.0), (47, 0.0, 0.0), (47, 0.3, 0.0), (47, 0.0, 0.9)]
)
def test_resume_continues_exactly_like_an_uninterrupted_run(
    tiny, tmp_path, stop_at, dropout, beta1
):
    """Stop at a checkpoint (at an epoch's end, or in the middle of one) and resume: the
    rest of the run takes the same batches (and dropout masks) and ends with the same
    model, to the bit. With ``beta1 = 0`` the first moments, never written, are not
    kept either."""
    train, _ = tiny
    cfg = dataclasses.replace(CFG, dropout=dropout, beta1=beta1)
    data = train.slice(0, 64 * 40)  # 40 batches an epoch
    policy = CheckpointPolicy(str(tmp_path / "whole"), every_steps=stop_at)
    whole = trainer(tiny, cfg, checkpoint=policy)  # checkpoints too: they rebuild the tables
    whole.train(data, Stream(64, epochs=2, seed=5))

    def crash_after_the_checkpoint(record):
        if record["step"] == stop_at:
            raise KeyboardInterrupt

    t = trainer(tiny, cfg, checkpoint=CheckpointPolicy(str(tmp_path / "part"), every_steps=stop_at))
    with pytest.raises(KeyboardInterrupt):
        t.train(data, Stream(64, epochs=2, seed=5), crash_after_the_checkpoint)
    ckpt = CheckpointStore(str(tmp_path / "part")).latest()
    pos = ckpt.meta["position"]
    last_epoch, last_batch = divmod(stop_at - 1, 40)  # of the last step trained
    assert ckpt.step == stop_at and pos == {"epoch": last_epoch, "batch": last_batch + 1}
    assert ("shard-0000/W.m" in ckpt.meta["arrays"]) == (beta1 > 0)
    resumed = trainer(tiny, cfg, restore=ckpt)
    resumed.train(data, Stream(64, epochs=2, seed=5).from_position(pos["epoch"], pos["batch"]))
    assert resumed.step == whole.step == 80
    losses = [r["loss"] for r in resumed.history]
    assert losses == [r["loss"] for r in whole.history[stop_at:]]
    for got, want in zip(
        resumed.network.hidden.params(), whole.network.hidden.params(), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(resumed.network.shards[0].W, whole.network.shards[0].W)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("flip", r"W\.npy: checksum mismatch \(the file is corrupted\)"),
        ("truncate", r"W\.npy: expected \d+ bytes, found \d+ bytes \(truncated\?\)"),
        ("delete", r"W\.npy: file missing from the checkpoint"),
        ("meta", r"meta\.json: not valid JSON"),
        ("version", r"checkpoint format version 99, this dslide-dask reads version 1"),
        ("foreign", r"not a dslide-dask checkpoint"),
        ("config", r"its config is not valid here: K must be"),
    ],
)
def test_a_damaged_checkpoint_says_what_is_wrong(tiny, tmp_path, damage, message):
    t = trainer(tiny)
    t.train(tiny[0].slice(0, 640), Stream(64))
    path = open_checkpoint(t.save(str(tmp_path))).path
    w = os.path.join(path, "shard-0000", "W.npy")
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    if damage == "flip":
        with open(w, "r+b") as f:
            f.seek(-3, 2)
            byte = f.read(1)
            f.seek(-3, 2)
            f.write(bytes([byte[0] ^ 0x40]))
    elif damage == "truncate":
        with open(w, "r+b") as f:
            f.truncate(os.path.getsize(w) - 100)
    elif damage == "delete":
        os.remove(w)
    elif damage == "meta":
        with open(meta_path, "w") as f:
            f.write('{"format": "dslide-checkpoint", ')
    else:
        if damage == "version":
            meta["version"] = 99
        elif damage == "foreign":
            meta["format"] = "something-else"
        elif damage == "config":
            meta["config"]["K"] = 0
        with open(meta_path, "w") as f:
            json.dump(meta, f)
    with pytest.raises(CheckpointError, match=message):
        trainer(tiny, restore=open_checkpoint(str(tmp_path)))


def test_a_checkpoint_of_another_model_is_refused(tiny, tmp_path):
    t = trainer(tiny)
    t.save(str(tmp_path))
    train, _ = tiny
    with pytest.raises(CheckpointError, match=r"has \d+ features and \d+ labels, the data"):
        LocalTrainer(
            CFG, train.n_features + 1, train.n_labels, restore=open_checkpoint(str(tmp_path))
        )
    with pytest.raises(CheckpointError, match="no checkpoint here"):
        open_checkpoint(str(tmp_path / "nothing"))


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tiny, tmp_path):
    train, _ = tiny
    t = trainer(tiny, checkpoint=CheckpointPolicy(str(tmp_path), every_steps=5))
    t.train(train.slice(0, 640), Stream(64))
    good = CheckpointStore(str(tmp_path)).latest()
    t.network.hidden.weights[0][:] = np.nan  # a diverged model
    with pytest.raises(FloatingPointError, match=rf"loss became nan at step 11.*{good.url}"):
        t.train(train.slice(0, 640), Stream(64))
    assert CheckpointStore(str(tmp_path)).latest().url == good.url
    trainer(tiny, restore=open_checkpoint(str(tmp_path)))  # still loads


KILLED_WRITER = """
import sys, time
import dslide_dask.checkpoint.store as store
from dslide_dask import SlideConfig
from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.stream import Stream
from dslide_dask.errors import NetworkAloneWarning
from dslide_dask.local_trainer import LocalTrainer

root, marker = sys.argv[1], sys.argv[2]
real_write = store.write_array

def stalling_write(fs, path, array):  # the second checkpoint stalls half-way into W.npy
    entry = real_write(fs, path, array)
    if "step-00000020" in path and path.endswith("W.npy"):
        with fs.open(path, "r+b") as f:
            f.truncate(entry["bytes"] // 2)
        open(marker, "w").write(path)
        time.sleep(60)
    return entry

store.write_array = stalling_write
train, _ = make_synthetic("tiny", seed=0)
cfg = SlideConfig(hidden=(32,), K=3, L=10, range_pow=8, min_active=100, max_active=400)
t = LocalTrainer(cfg, train.n_features, train.n_labels,
                 checkpoint=CheckpointPolicy(root, every_steps=10))
t.train(train, Stream(64))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_while_writing_a_checkpoint_the_previous_one_loads(tiny, tmp_path):
    root, marker = tmp_path / "ckpt", tmp_path / "writing"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(KILLED_WRITER))
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(marker)])
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None, "the writer ended before the second checkpoint"
            assert time.monotonic() < deadline, "the writer never reached the second checkpoint"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    half_written = marker.read_text()
    assert os.path.getsize(half_written) > 0  # the stalled write was really under way
    ckpt = CheckpointStore(str(root)).latest()
    assert ckpt.step == 10  # LATEST still names the complete one
    train, test = tiny
    resumed = trainer(tiny, restore=ckpt)
    pos = ckpt.meta["position"]
    resumed.train(train, Stream(64).from_position(pos["epoch"], pos["batch"]))
    assert resumed.step > 10
    # the next commit clears the half-written folder away
    resumed.save(str(root))
    names = CheckpointStore(str(root)).list()
    assert len(names) == 1 and "step-00000020" not in names[0]


def test_estimator_save_and_load_round_trip(tiny, tmp_path):
    train, test = tiny
    clf = SlideClassifier(hidden=(32,), epochs=2, min_active=100, max_active=400)
    clf.fit(train.X, train.Y, eval_set=(test.X, test.Y), eval_every=15)  # 40 steps
    url = clf.save(f"file://{tmp_path}/model")
    assert url.startswith("file://")
    again = SlideClassifier.load(f"file://{tmp_path}/model")
    assert again.get_params() == clf.get_params()
    np.testing.assert_array_equal(again.predict_topk(test.X, 5), clf.predict_topk(test.X, 5))
    assert again.n_steps_ == clf.n_steps_
    assert again.evals_ == clf.evals_
    assert [e["step"] for e in clf.evals_] == [15, 30, clf.n_steps_]  # and at the end
    assert clf.evals_[-1]["P@1"] == clf.score(test.X, test.Y)


def test_a_classifier_loaded_to_answer_answers_alike_and_refuses_to_train_or_save(tiny, tmp_path):
    """``load(answering=True)`` leaves the optimiser state unread: the same answers (the
    fused model's too), and a refusal, the saved model untouched, where the zeroed
    moments would train or be saved as real ones."""
    train, test = tiny
    clf = SlideClassifier(hidden=(32,), epochs=1, min_active=100, max_active=400)
    url = clf.fit(train.X, train.Y).save(f"file://{tmp_path}/model")
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    whole = SlideClassifier.load(url)
    answering = SlideClassifier.load(url, answering=True)
    assert answering.fused_model() is not None
    ids, scores = answering.predict_topk(test.X, 5, return_scores=True)
    ids_whole, scores_whole = whole.predict_topk(test.X, 5, return_scores=True)
    np.testing.assert_array_equal(ids, ids_whole)
    np.testing.assert_array_equal(scores, scores_whole)
    for shard in answering.trainer_.network.shards:
        assert not shard.state()[0]["W.v"].any()
    refusal = "loaded to answer only .*answering=False"
    with pytest.raises(ValueError, match=refusal), pytest.warns(NetworkAloneWarning):
        answering.partial_fit(train.X[:64], train.Y[:64])
    with pytest.raises(ValueError, match=refusal):
        answering.save(f"file://{tmp_path}/again")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_the_estimator_checkpoints_as_asked(tiny, tmp_path):
    train, _ = tiny
    clf = SlideClassifier(hidden=(16,), checkpoint_url=str(tmp_path), checkpoint_every=7)
    clf.fit(train.X, train.Y)  # 20 steps
    assert CheckpointStore(str(tmp_path)).latest().step == 14
    with pytest.raises(ValueError, match=r"checkpoint_every must be an integer in \[1, "):
        SlideClassifier(checkpoint_url=str(tmp_path)).fit(train.X, train.Y)


def test_a_checkpoint_without_update_counts_loads_with_rows_as_old_as_the_model(tiny, tmp_path):
    """Checkpoints written before rows counted their own Adam updates lack ``W.n`` and
    ``W0.n``: those runs corrected every row by the global step, so that is restored."""
    t = trainer(tiny, n_shards=2)
    t.train(tiny[0].slice(0, 640), Stream(64))
    path = open_checkpoint(t.save(str(tmp_path))).path
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    counts = [name for name in meta["arrays"] if name.endswith(("/W.n", "/W0.n"))]
    assert len(counts) == 3  # the input layer's and two shards'
    for name in counts:
        del meta["arrays"][name]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    for n_shards in (2, 3):  # the shards' own layout, and re-sharded
        again = trainer(tiny, n_shards=n_shards, restore=open_checkpoint(str(tmp_path)))
        net = again.network
        assert (net.hidden.row_updates == t.step).all()
        assert all((shard.W_n == t.step).all() for shard in net.shards)
        np.testing.assert_array_equal(net.hidden.weights[0], t.network.hidden.weights[0])

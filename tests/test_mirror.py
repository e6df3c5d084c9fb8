"""Rows streamed to a new layout while the old shards train (:mod:`dslide_dask.model.mirror`),
in one process: whatever order the messages arrive in, the new shards end up with the old
shards' rows as they are after the last step, bit for bit."""

import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.mirror import Replica, RowMirror
from dslide_dask.model.wide_shard import WideShard, combine_partials

N_LABELS, DIM, BATCH = 2_003, 16, 64


def _step(shards: list[WideShard], rng: np.random.Generator) -> None:
    h = rng.standard_normal((BATCH, shards[0].dim_in)).astype(np.float32)
    counts = rng.integers(1, 4, BATCH)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    labels = (rng.zipf(1.3, indptr[-1]) % N_LABELS).astype(np.int32)
    Y = CSR(indptr, labels, np.ones(len(labels), np.float32), N_LABELS)
    lse, _ = combine_partials([s.forward(h, Y) for s in shards])
    for s in shards:
        s.backward(lse)


def _by_neuron(shards: list[WideShard]) -> dict[str, np.ndarray]:
    out = {}
    for shard in shards:
        rows = shard.global_ids(np.arange(shard.n_local))
        for name in shard.kept_arrays():
            a = shard.state()[0][name]
            out.setdefault(name, np.zeros((N_LABELS, *a.shape[1:]), a.dtype))[rows] = a
    return out


@pytest.mark.parametrize(
    ("beta1", "dropout", "shuffled", "dim", "negatives"),
    [
        (0.0, 0.0, False, 128, "example"),
        (0.9, 0.2, True, 37, "example"),
        (0.0, 0.2, True, 37, "shared"),
    ],
)
def test_replicas_hold_the_old_rows_bit_for_bit_after_training_on(
    beta1, dropout, shuffled, dim, negatives
):
    """(Widths with and without a remainder after the kernel's vectorised loop; random
    negatives drawn per example and shared by the batch.)"""
    cfg = SlideConfig(
        hidden=(dim,), K=2, L=4, beta1=beta1, dropout=dropout, min_active=64, negatives=negatives
    ).for_data(N_LABELS, steps=100)
    old = ShardLayout.strided(N_LABELS, 2)
    shards = [WideShard(cfg, dim, old, s) for s in range(2)]
    rng = np.random.default_rng(0)
    for _ in range(5):
        _step(shards, rng)
    new = old.rebalanced((1, 1, 1, 1), (0, 1))
    replicas = [Replica(WideShard(cfg, dim, new, k, initialize=False), old) for k in range(4)]
    mirrors = [RowMirror(s, new) for s in shards]
    for m in mirrors:  # a slice of the rows a step: the rows go over several steps
        for t in m.targets:
            t.per_step = -(-len(t.here) // 4)
    inbox = []
    for _ in range(12):
        _step(shards, rng)
        for s, m in zip(shards, mirrors, strict=True):
            inbox += m.after_step(s)
    assert all(m.done for m in mirrors)
    if shuffled:  # messages from one source may overtake each other on the way
        inbox = [inbox[i] for i in rng.permutation(len(inbox))]
    for k, message in inbox:
        replicas[k].take(message)
    assert all(r.ready and r.step == shards[0].step for r in replicas)
    want, got = _by_neuron(shards), _by_neuron([r.shard for r in replicas])
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    updated = [m for _, m in inbox if m.update is not None and len(m.update.rows)]
    assert updated, "no step's update was replayed: the test would not see a wrong replay"
    if negatives == "shared":
        assert any(len(m.update.shared_rows) for m in updated), "no shared rows replayed"


def test_rows_sent_at_once_need_no_step():
    cfg = SlideConfig(hidden=(DIM,), K=2, L=4).for_data(N_LABELS)
    old = ShardLayout.strided(N_LABELS, 2)
    shards = [WideShard(cfg, DIM, old, s) for s in range(2)]
    _step(shards, np.random.default_rng(1))
    new = old.rebalanced((1, 1, 1), (0, 1))
    replicas = [Replica(WideShard(cfg, DIM, new, k, initialize=False), old) for k in range(3)]
    for s in shards:
        for k, message in RowMirror(s, new).after_step(s, rest=True):
            replicas[k].take(message)
    want, got = _by_neuron(shards), _by_neuron([r.shard for r in replicas])
    assert all(r.ready for r in replicas)
    np.testing.assert_array_equal(got["W"], want["W"])

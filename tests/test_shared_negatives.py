"""Random negatives shared by a batch (``negatives="shared"``,
:mod:`dslide_dask.model.shared_negatives`): each neuron is scored once per example, the
kinds are right, and over the whole layer the step is the exact softmax's."""

import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.kernels.active_sets import SHARED_FOUND, SHARED_LABEL, SHARED_RANDOM
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.wide_shard import WideShard, combine_partials

DIM, BATCH = 16, 32


def _batch(rng: np.random.Generator, n_labels: int) -> tuple[np.ndarray, CSR]:
    h = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    rows = [rng.choice(n_labels, rng.integers(1, 4), replace=False) for _ in range(BATCH)]
    rows[3] = np.zeros(0, np.int64)  # an example with no label trains nothing
    return h, CSR.from_lists(rows, n_labels)


def _shard(n_labels: int, **opts) -> WideShard:
    cfg = SlideConfig(hidden=(DIM,), K=2, L=6, dropout=0.0, **opts).for_data(n_labels)
    return WideShard(cfg, DIM, ShardLayout.strided(n_labels, 1))


def test_shared_neurons_leave_the_rows_and_are_marked_by_kind():
    n_labels = 500
    shard = _shard(n_labels, negatives="shared", min_active=200)
    shard.rehash()  # a fresh shard's tables wait for the first scheduled rebuild
    h, Y = _batch(np.random.default_rng(0), n_labels)
    sets = shard.hash(h, Y)
    block = sets.shared
    assert block is not None and len(block.rows) == 200 and len(np.unique(block.rows)) == 200
    buckets = shard.index.buckets(h)
    for b in range(BATCH):
        labels = set(Y.row(b).tolist())
        row = set(sets.active[b, : sets.n_active[b]].tolist())
        assert not row & set(block.rows.tolist()), "a shared neuron was also scored alone"
        found = {
            int(n)
            for t in range(shard.index.ids.shape[0])
            for n in shard.index.ids[t, buckets[b, t], : shard.index.counts[t, buckets[b, t]]]
        }
        for j, n in enumerate(block.rows.tolist()):
            want = SHARED_LABEL if n in labels else SHARED_FOUND if n in found else SHARED_RANDOM
            assert block.kind[b, j] == want, (b, n)
        assert labels <= row | set(block.rows.tolist())
        want_active = sets.n_found[b] if labels else 0  # no per-example padding
        assert sets.n_active[b] == want_active
    assert (block.kind == SHARED_FOUND).any(), "no retrieved neuron was shared: weak test"


def _exact_step(W, bias, h, Y):
    """Loss and d loss / d h of the full softmax (numpy, float64)."""
    logits = h.astype(np.float64) @ W.T.astype(np.float64) + bias
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    target = np.zeros_like(logits)
    labelled = np.diff(Y.indptr) > 0
    for b in np.flatnonzero(labelled):
        target[b, Y.row(b)] = 1 / len(Y.row(b))
    grad = (np.exp(logits - lse[:, None]) - target) * labelled[:, None] / labelled.sum()
    loss = (lse - (target * logits).sum(1))[labelled].mean()
    return loss, grad @ W.astype(np.float64)


@pytest.mark.parametrize("negatives", ["shared", "example"])
def test_negatives_over_the_whole_layer_give_the_exact_softmax(negatives):
    """With as many negatives as neurons every example scores each neuron once, with no
    correction: the step's loss and input gradient are the full softmax's."""
    n_labels = 60
    shard = _shard(n_labels, negatives=negatives, min_active=n_labels, max_active=n_labels)
    h, Y = _batch(np.random.default_rng(1), n_labels)
    W, bias = shard.W.copy(), shard.bias.copy()
    parts = shard.forward(h, Y)
    lse, label_term = combine_partials([parts])
    grad_h = shard.backward(lse)
    labelled = np.diff(Y.indptr) > 0
    loss, want = _exact_step(W, bias, h, Y)
    assert (parts.n_active[labelled] == n_labels).all() and (parts.n_active[~labelled] == 0).all()
    np.testing.assert_allclose((lse - label_term)[labelled].mean(), loss, rtol=1e-5)
    np.testing.assert_allclose(grad_h, want, atol=1e-6)


def test_shared_negatives_stand_for_the_neurons_not_found():
    """A shared random neuron's logit carries log(neurons its example did not find /
    random shared neurons it scored): the sampled-softmax correction."""
    n_labels = 5_000
    shard = _shard(n_labels, negatives="shared", min_active=300)
    h, Y = _batch(np.random.default_rng(2), n_labels)
    sets = shard.hash(h, Y)
    shard.gather(sets)
    block = sets.shared
    plain = h @ shard.W[block.rows].T + shard.bias[block.rows]
    n_random = (block.kind == SHARED_RANDOM).sum(1)
    rest = n_labels - sets.n_found - (block.kind != SHARED_RANDOM).sum(1)
    for b in (0, 1, 2):
        j = np.flatnonzero(block.kind[b] == SHARED_RANDOM)[0]
        np.testing.assert_allclose(
            block.logits[b, j] - plain[b, j], np.log(rest[b] / n_random[b]), rtol=1e-5
        )
        k = np.flatnonzero(block.kind[b] != SHARED_RANDOM)
        np.testing.assert_allclose(block.logits[b, k], plain[b, k], rtol=1e-5, atol=1e-6)


def test_auto_shares_negatives_below_many_labels_and_draws_them_per_example_above():
    few, many = SlideConfig().for_data(26_556), SlideConfig().for_data(670_091)
    assert (few.negatives, few.min_active) == ("shared", 4096)
    assert (many.negatives, many.min_active) == ("example", 2500)
    fused = SlideConfig().for_data(670_091, fused=True)  # neighbours and a tree rank its output
    assert (fused.negatives, fused.min_active) == ("example", 1000)
    assert SlideConfig().for_data(670_091, fused=True, rare=True).min_active == 60
    assert SlideConfig().for_data(670_091, rare=True).min_active == 2500  # ranks alone
    assert SlideConfig().for_data(26_556, fused=True).min_active == 4096
    given = SlideConfig(negatives="example", min_active=300).for_data(26_556)
    assert (given.negatives, given.min_active) == ("example", 300)


def test_a_model_saved_before_shared_negatives_keeps_drawing_them_per_example():
    from dslide_dask.checkpoint.model import config_of

    class Saved:
        url = "memory://old"
        meta = {"config": {"hidden": [16], "min_active": 2500}}

    assert config_of(Saved()).for_data(26_556).negatives == "example"

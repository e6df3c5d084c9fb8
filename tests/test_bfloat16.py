"""Half-size Adam state: bfloat16 moments with float32 arithmetic."""

import dataclasses

import numpy as np
import pytest

from dslide_dask import SlideConfig
from dslide_dask.checkpoint import open_checkpoint
from dslide_dask.data.stream import Stream
from dslide_dask.distributed.memory_plan import hidden_memory, shard_memory
from dslide_dask.kernels import adam
from dslide_dask.kernels.bfloat16 import from_bfloat16, to_bfloat16
from dslide_dask.local_trainer import LocalTrainer

CFG = SlideConfig(hidden=(32,), K=3, L=10, range_pow=8, min_active=100, max_active=400)
BF16 = dataclasses.replace(CFG, moment_dtype="bfloat16")


def test_conversions_round_to_nearest_even_and_widen_exactly():
    values = np.array([1.0, -2.5, 3.140625, 1 + 2**-8, 1 + 3 * 2**-8, 1e-30], np.float32)
    bits = to_bfloat16(values)
    assert bits.dtype == np.uint16
    back = from_bfloat16(bits)
    assert back[:3].tolist() == [1.0, -2.5, 3.140625]  # representable: exact
    assert back[3] == 1.0 and back[4] == 1 + 2**-6  # ties go to the even mantissa
    assert back[5] == pytest.approx(1e-30, rel=2**-8)


def _adam_steps(dtype, n_steps: int, zero_from: int):
    """Lazy Adam on random sparse rows; gradients are 0 from step ``zero_from`` on (the
    rows still take steps: their second moment decays by beta2 each time)."""
    rows_n, width, batch, per = 500, 16, 64, 4
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((rows_n, width)) * 0.05).astype(np.float32)
    W0 = W.copy()
    m, v = np.zeros(W.shape, dtype), np.zeros(W.shape, dtype)
    updates = np.zeros(rows_n, np.int32)
    empty = np.zeros(0, np.float32)
    starts = np.arange(batch) * per
    for step in range(1, n_steps + 1):
        rows = rng.integers(0, rows_n, batch * per).astype(np.int32)
        scale = 0.1 if step < zero_from else 0.0
        coefs = (rng.standard_normal(batch * per) * scale).astype(np.float32)
        vectors = rng.standard_normal((batch, width)).astype(np.float32)
        entries = (starts, starts + per, rows, coefs, vectors)
        state = (W, m, v, empty, empty, empty, updates)  # no bias
        no_grads = np.zeros((0, 0), np.float32)
        adam.adam_rows(*entries, *state, 1e-3, 0.9, 0.999, 1e-8, True, no_grads, step)
    widen = (lambda a: a) if dtype == np.float32 else from_bfloat16
    return W0, W, widen(m), widen(v)


def test_bfloat16_moments_follow_float32_adam():
    W0, W32, m32, v32 = _adam_steps(np.float32, 150, zero_from=10**9)
    _, W16, m16, v16 = _adam_steps(np.uint16, 150, zero_from=10**9)
    moved = np.abs(W32 - W0).mean()
    assert np.abs(W16 - W32).mean() < 0.02 * moved
    assert v16.sum() == pytest.approx(v32.sum(), rel=0.01)
    assert np.abs(m16).sum() == pytest.approx(np.abs(m32).sum(), rel=0.01)


def test_a_decaying_second_moment_does_not_freeze_in_bfloat16():
    """beta2 = 0.999 moves v by 0.1% a step, under bfloat16's 0.4% resolution: rounded to
    nearest, v would never decay; rounded stochastically it decays as in float32."""
    *_, v32 = _adam_steps(np.float32, 600, zero_from=100)
    *_, v16 = _adam_steps(np.uint16, 600, zero_from=100)
    _, _, _, v_then = _adam_steps(np.float32, 99, zero_from=10**9)
    assert v32.sum() < 0.7 * v_then.sum()  # it did decay (500 dense steps: 0.999**500)
    assert v16.sum() == pytest.approx(v32.sum(), rel=0.02)


def test_a_bfloat16_model_learns_like_a_float32_one_in_half_the_state(tiny):
    train, test = tiny
    scores = {}
    for cfg in (CFG, BF16):
        t = LocalTrainer(cfg, train.n_features, train.n_labels)
        t.train(train, Stream(64, epochs=3, seed=1))
        scores[cfg.moment_dtype] = t.evaluate(test)["P@1"]
        shard, hidden = t.network.shards[0], t.network.hidden
        state = shard.W_v.nbytes + hidden.moments[0][1].nbytes
        if cfg is CFG:
            full = state
    assert shard.W_v.dtype == np.uint16 and hidden.moments[0][1].dtype == np.uint16
    assert state == full // 2
    assert scores["float32"] > 0.3, scores
    assert abs(scores["bfloat16"] - scores["float32"]) < 0.03, scores


def test_bfloat16_state_survives_a_checkpoint_and_converts_on_restore(tiny, tmp_path):
    train, _ = tiny
    t = LocalTrainer(BF16, train.n_features, train.n_labels)
    t.train(train.slice(0, 64 * 20), Stream(64))
    t.save(str(tmp_path / "model"))
    ckpt = open_checkpoint(str(tmp_path / "model"))
    again = LocalTrainer(BF16, train.n_features, train.n_labels, restore=ckpt)
    np.testing.assert_array_equal(again.network.shards[0].W_v, t.network.shards[0].W_v)
    # a float32 shard given that state widens the moments (values, not bit patterns)
    wide = LocalTrainer(CFG, train.n_features, train.n_labels).network.shards[0]
    wide.set_state(*t.network.shards[0].state())
    assert wide.W_v.dtype == np.float32
    np.testing.assert_array_equal(wide.W_v, from_bfloat16(t.network.shards[0].W_v))
    np.testing.assert_array_equal(wide.W, t.network.shards[0].W)


def test_the_memory_plan_counts_half_size_moments():
    full, half = shard_memory(CFG, 10_000), shard_memory(BF16, 10_000)
    assert half["weights"] == full["weights"]
    # bfloat16 rows, float32 bias, int32 update count
    assert half["optimizer"] == 10_000 * (2 * 32 + 4 + 4)
    assert full["optimizer"] == 10_000 * (4 * 32 + 4 + 4)
    assert hidden_memory(BF16, 1000)["optimizer"] < 0.6 * hidden_memory(CFG, 1000)["optimizer"]

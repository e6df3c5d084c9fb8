"""The engine against a dense numpy reference, and its invariants."""

import numba
import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.model import SlideConfig, SlideNetwork
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.wide_shard import WideShard, combine_partials
from tests.reference import DenseNetwork, softmax_grad


def random_batch(rng, n, n_features, n_labels, nnz=6, max_labels=3):
    rows = [np.sort(rng.choice(n_features, nnz, replace=False)) for _ in range(n)]
    X = CSR(
        np.arange(n + 1) * nnz,
        np.concatenate(rows),
        rng.random(n * nnz).astype(np.float32) + 0.1,
        n_features,
    )
    Y = CSR.from_lists(
        [rng.choice(n_labels, rng.integers(1, max_labels + 1), replace=False) for _ in range(n)],
        n_labels,
    )
    return X, Y


def dense(X: CSR) -> np.ndarray:
    out = np.zeros(X.shape)
    for i in range(X.n_rows):
        lo, hi = X.indptr[i], X.indptr[i + 1]
        out[i, X.indices[lo:hi]] = X.data[lo:hi]
    return out


def all_active(n_labels: int, **kw) -> SlideConfig:
    """A config whose active sets hold every neuron, without dropout: exact full softmax."""
    base = dict(K=2, L=4, range_pow=4, bucket_capacity=4, lr=1e-2, dropout=0.0)
    base.update(input_lr=base["lr"], output_lr=base["lr"])
    base.update(kw)
    return SlideConfig(min_active=n_labels, max_active=n_labels, **base)


def test_wide_shard_matches_full_softmax():
    rng = np.random.default_rng(1)
    n_labels, dim, B = 40, 8, 16
    cfg = all_active(n_labels)
    shard = WideShard(cfg, dim, ShardLayout.strided(n_labels, 1))
    W0, b0 = shard.W.copy(), shard.bias.copy()
    h = rng.random((B, dim)).astype(np.float32)
    _, Y = random_batch(rng, B, 10, n_labels)
    lse, label_term = combine_partials([shard.forward(h, Y)])
    grad_h = shard.backward(lse)

    logits = h.astype(np.float64) @ W0.T + b0
    ref_lse, g = softmax_grad(logits, Y.to_lists())
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    ref_label = [logits[b, y].mean() for b, y in enumerate(Y.to_lists())]
    np.testing.assert_allclose(label_term, ref_label, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad_h, g @ W0, rtol=1e-4, atol=1e-7)
    ref = DenseNetwork([], [], W0, b0, cfg.lr, cfg.output_lr, cfg.beta1)
    ref.params = [W0.astype(np.float64), b0.astype(np.float64)]
    grad_W = g.T @ h
    np.testing.assert_allclose(shard.W, ref.opt[0].step(ref.params[0], grad_W), atol=1e-6)
    np.testing.assert_allclose(shard.bias, ref.opt[1].step(ref.params[1], g.sum(0)), atol=1e-6)


def test_dropout_is_a_mask_on_the_wide_layers_input():
    """With dropout the shard computes the full softmax of ``h * mask`` and returns the
    gradient w.r.t. the unmasked ``h`` (zero where a unit was dropped); each step draws a
    new mask, and the same one in every shard."""
    rng = np.random.default_rng(4)
    n_labels, dim, B = 40, 8, 16
    cfg = all_active(n_labels, dropout=0.5)
    shards = [WideShard(cfg, dim, ShardLayout.strided(n_labels, 2), s) for s in (0, 1)]
    masks = [shard._dropout((B, dim)) for shard in shards]
    np.testing.assert_array_equal(masks[0], masks[1])
    keep = masks[0]
    assert set(np.unique(keep)) == {0.0, 2.0}
    W0 = np.zeros((n_labels, dim), np.float32)
    for shard in shards:
        W0[shard.global_ids(np.arange(shard.n_local))] = shard.W
    h = rng.random((B, dim)).astype(np.float32)
    _, Y = random_batch(rng, B, 10, n_labels)
    lse, _ = combine_partials([shard.forward(h, Y) for shard in shards])
    grad_h = sum(shard.backward(lse) for shard in shards)

    ref_lse, g = softmax_grad((h * keep).astype(np.float64) @ W0.T, Y.to_lists())
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    np.testing.assert_allclose(grad_h, (g @ W0) * keep, rtol=1e-4, atol=1e-7)
    assert not np.array_equal(shards[0]._dropout((B, dim)), keep)  # the next step's


@pytest.mark.parametrize("beta1", [0.0, 0.9])  # without and with first moments
@pytest.mark.parametrize("hidden", [(16,), (16, 8)])
def test_network_matches_dense_reference_over_steps(hidden, beta1):
    """Dense Adam, every neuron active: several steps equal the numpy reference."""
    rng = np.random.default_rng(2)
    n_features, n_labels, B = 30, 24, 12
    cfg = all_active(
        n_labels,
        hidden=hidden,
        optimizer="dense-adam",
        bin_size=4,
        init_std=0.3,
        beta1=beta1,
        input_lr=2e-2,
        output_lr=4e-3,
    )
    net = SlideNetwork(cfg, n_features, n_labels)
    shard = net.shards[0]
    ref = DenseNetwork(
        net.hidden.weights,
        net.hidden.biases,
        shard.W,
        shard.bias,
        cfg.lr,
        cfg.output_lr,
        cfg.beta1,
        cfg.input_lr,
    )
    for _ in range(3):
        X, Y = random_batch(rng, B, n_features, n_labels)
        net.train_step(X, Y)
        ref.step(dense(X), Y.to_lists())
    mine = [*net.hidden.weights, *net.hidden.biases, shard.W, shard.bias]
    for got, want, opt in zip(mine, ref.params, ref.opt, strict=True):
        # Adam turns gradients of ~1e-10 (float32 noise around an exact cancellation)
        # into full +-lr steps: coordinates that never had a real gradient (v sums the
        # squared gradients of every step) are not comparable and are left out.
        well_defined = (opt.v > 1e-15) | (opt.v == 0)
        assert well_defined.mean() > 0.75
        np.testing.assert_allclose(got[well_defined], want[well_defined], atol=0.01 * cfg.output_lr)


def test_lazy_adam_leaves_untouched_input_rows_alone():
    rng = np.random.default_rng(3)
    n_features, n_labels = 50, 20
    net = SlideNetwork(all_active(n_labels, hidden=(8,), bin_size=4), n_features, n_labels)
    before = net.hidden.weights[0].copy()
    X, Y = random_batch(rng, 4, n_features, n_labels, nnz=3)
    for _ in range(3):
        net.train_step(X, Y)
    touched = np.unique(X.indices)
    untouched = np.setdiff1d(np.arange(n_features), touched)
    assert np.array_equal(net.hidden.weights[0][untouched], before[untouched])
    assert not np.allclose(net.hidden.weights[0][touched], before[touched])


@pytest.mark.parametrize("beta1", [0.0, 0.9])
def test_a_rows_first_update_is_adams_first_step_however_late(beta1):
    """Lazy Adam corrects each row by its own update count: a row first touched after
    1,000 steps of other rows moves by lr per coordinate, as at step 1 (corrected by the
    global step it moved 25 times as far, and rare rows blew up)."""
    from dslide_dask.kernels import adam

    rows_n, H, lr = 3, 4, 1e-3
    W = np.zeros((rows_n, H), np.float32)
    m, v = np.zeros_like(W), np.zeros_like(W)
    updates = np.zeros(rows_n, np.int32)
    empty = np.zeros(0, np.float32)
    vector = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)

    def step(row: int) -> None:
        entries = (np.array([0]), np.array([1]), np.array([row], np.int32), np.ones(1, np.float32))
        state = (W, m, v, empty, empty, empty, updates)  # no bias
        no_grads = np.zeros((0, 0), np.float32)
        adam.adam_rows(*entries, vector, *state, lr, beta1, 0.999, 1e-8, False, no_grads)

    for _ in range(1000):
        step(0)
    step(1)
    np.testing.assert_allclose(W[1], -lr * np.sign(vector[0]), rtol=1e-4)
    assert updates.tolist() == [1000, 1, 0]
    assert not W[2].any()


def test_shards_equal_one_shard_when_all_neurons_active():
    rng = np.random.default_rng(4)
    n_features, n_labels = 40, 30
    cfg = all_active(n_labels, hidden=(16,))
    nets = [
        SlideNetwork(cfg, n_features, n_labels),
        SlideNetwork(cfg, n_features, n_labels, n_shards=3),
        SlideNetwork(
            cfg, n_features, n_labels, layout=ShardLayout.from_capacities(n_labels, (2, 1))
        ),
    ]
    for _ in range(4):
        X, Y = random_batch(rng, 10, n_features, n_labels)
        losses = [net.train_step(X, Y).loss for net in nets]
        assert losses[1:] == pytest.approx([losses[0]] * 2, rel=1e-5)
    X, _ = random_batch(rng, 10, n_features, n_labels)
    for net in nets[1:]:
        np.testing.assert_array_equal(nets[0].topk(X, 5), net.topk(X, 5))


def test_results_do_not_depend_on_thread_count():
    """Updates are race-free: 1 thread and all threads give bit-identical weights."""
    rng = np.random.default_rng(5)
    X, Y = random_batch(rng, 64, 200, 500, nnz=8)
    cfg = SlideConfig(hidden=(32,), K=3, L=8, range_pow=6, bucket_capacity=16, min_active=20)
    weights = []
    before = numba.get_num_threads()
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            net = SlideNetwork(cfg, 200, 500)
            for start in range(0, 64, 16):
                net.train_step(X.slice_rows(start, start + 16), Y.slice_rows(start, start + 16))
            weights.append((net.hidden.weights[0].copy(), net.shards[0].W.copy()))
    finally:
        numba.set_num_threads(before)  # numba's thread count is process-wide
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_examples_without_labels_train_nothing():
    rng = np.random.default_rng(6)
    net = SlideNetwork(all_active(20, hidden=(8,), bin_size=4), 30, 20)
    X, _ = random_batch(rng, 4, 30, 20)
    Y = CSR.from_lists([[], [], [], []], 20)
    W = net.shards[0].W.copy()
    stats = net.train_step(X, Y)
    assert stats.loss == 0.0
    np.testing.assert_array_equal(net.shards[0].W, W)


def test_exact_and_lsh_topk_agree_when_all_neurons_retrieved():
    rng = np.random.default_rng(7)
    n_labels = 64
    cfg = SlideConfig(hidden=(16,), K=1, L=64, range_pow=1, bucket_capacity=64, bin_size=4)
    net = SlideNetwork(cfg, 40, n_labels)
    X, _ = random_batch(rng, 20, 40, n_labels)
    np.testing.assert_array_equal(net.topk(X, 5, exact=True), net.topk(X, 5, exact=False))


@pytest.mark.parametrize("n_rows", [1, 9, 300])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_exact_topk_equals_a_stable_sort_of_the_scores(n_rows, n_threads, monkeypatch):
    """Tile by tile, on one thread or several (300 rows: more tasks than threads), each
    row keeps its k best (the lower id first on a tie, as numpy's stable sort), whatever
    the tiles' widths; a NaN score never enters and a row with too few finite scores
    ends in -1/-inf."""
    from dslide_dask.model import exact_topk as module

    monkeypatch.setattr(module, "TILE_LABELS", 37)  # not a multiple of the scan's block
    monkeypatch.setattr(module, "ROWS_PER_TILE", 64)
    monkeypatch.setattr(module, "THREADED_ROWS", 2)
    rng = np.random.default_rng(11)
    n_labels, k = 1000, 7
    h = rng.integers(0, 3, size=(n_rows, 4)).astype(np.float32)
    W = rng.integers(0, 3, size=(n_labels, 4)).astype(np.float32)  # many ties
    bias = rng.integers(0, 3, size=n_labels).astype(np.float32)
    bias[5] = np.nan
    bias[:500] -= np.arange(500)  # the best late: many pushes
    scores = h @ W.T + bias
    h[0] = np.nan  # a row with nothing to keep
    ids, best = module.exact_topk(h, W, bias, k, n_threads)
    assert np.all(ids[0] == -1) and np.all(best[0] == -np.inf)
    want = np.argsort(-np.nan_to_num(scores[1:], nan=-np.inf), axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids[1:], want)
    np.testing.assert_array_equal(best[1:], np.take_along_axis(scores[1:], want, 1))
    few, few_best = module.exact_topk(h[1:], W[:3], bias[:3], 5, n_threads)
    assert np.all(few[:, 3:] == -1) and np.all(few_best[:, 3:] == -np.inf)


@pytest.mark.parametrize("n", [5, 32, 33, 100, 5000])
@pytest.mark.parametrize("k", [1, 7, 64])
def test_scan_top_equals_a_stable_sort_above_the_floor(n, k):
    """The k best values above the floor, the lower index first on a tie (numpy's stable
    sort), whether the blocks' bar or the floor decides which blocks are walked; fewer
    than k above the floor end in -1/-inf."""
    from dslide_dask.kernels.topk import scan_top

    rng = np.random.default_rng(n + k)
    for values in (
        rng.integers(0, 4, n).astype(np.float32),  # many ties, many at or below the floor
        rng.standard_normal(n).astype(np.float32),
        np.where(np.arange(n) % 97 == 0, 2.0, 0.0).astype(np.float32),  # few above
    ):
        ids, scores = np.empty(k, np.int64), np.empty(k, np.float32)
        scan_top(values, ids, scores, 0.0)
        order = np.argsort(-values, kind="stable")
        want = order[values[order] > 0.0][:k]
        np.testing.assert_array_equal(ids[: len(want)], want)
        np.testing.assert_array_equal(scores[: len(want)], values[want])
        assert np.all(ids[len(want) :] == -1) and np.all(scores[len(want) :] == -np.inf)


def test_beta1_zero_keeps_no_first_moments():
    """With beta1 = 0 the first moments are never written (their pages are never
    touched); with beta1 > 0 they are."""
    rng = np.random.default_rng(5)
    X, Y = random_batch(rng, 8, 30, 20)
    for beta1, kept in ((0.0, False), (0.5, True)):
        net = SlideNetwork(all_active(20, hidden=(8,), bin_size=4, beta1=beta1), 30, 20)
        net.train_step(X, Y)
        moments = [net.shards[0].W_m, net.shards[0].bias_m, net.hidden.moments[0][0]]
        assert all(bool(m.any()) == kept for m in moments)


@pytest.mark.parametrize("n_bands", [1, 2, 4])
@pytest.mark.parametrize("n_rows", [1, 3, 50, 1000])
def test_entries_are_grouped_by_row_in_example_order(n_rows, n_bands):
    """The banded counting sort equals a stable sort of the entries by row."""
    from dslide_dask.kernels.adam import group_rows

    rng = np.random.default_rng(n_rows)
    sizes = rng.integers(0, 12, size=9)  # some examples have no entries
    starts = np.concatenate([[0], np.cumsum(sizes + 2)[:-1]]).astype(np.int64)
    ends = starts + sizes
    rows = rng.integers(0, n_rows, size=int(ends[-1]) + 2)
    pos = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)]).astype(
        np.int64
    )
    order = np.argsort(rows[pos], kind="stable")
    offsets, entry_pos, entry_vec, touched = group_rows(starts, ends, rows, n_rows, n_bands)
    assert np.array_equal(entry_pos, pos[order])
    assert np.array_equal(entry_vec, np.repeat(np.arange(9), sizes)[order])
    assert np.array_equal(
        offsets, np.concatenate([[0], np.cumsum(np.bincount(rows[pos], minlength=n_rows))])
    )
    assert np.array_equal(touched, np.unique(rows[pos]))


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.float64])
@pytest.mark.parametrize("width", [1, 17, 128])
def test_prefetching_a_row_compiles_for_every_storage_and_changes_nothing(dtype, width):
    """The prefetch intrinsic (its LLVM name differs across LLVM versions) compiles for
    the weights' and moments' dtypes and any row width, and only asks the cache."""
    import numba

    from dslide_dask.kernels.prefetch import prefetch_row, prefetch_row_read

    @numba.njit
    def touch(arr):
        for r in range(arr.shape[0]):
            prefetch_row(arr, r)
            prefetch_row_read(arr, r)

    arr = np.arange(5 * width).astype(dtype).reshape(5, width)
    before = arr.copy()
    touch(arr)
    np.testing.assert_array_equal(arr, before)

"""The frequent labels' own linear classifiers: the lockstep dual coordinate descent
against a label-by-label numpy reference, what the solution must satisfy, and their
votes against dense scoring."""

import numba
import numpy as np
import pytest

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import label_svm
from dslide_dask.model import label_classifiers
from dslide_dask.model.label_classifiers import LabelClassifiers, _columns_of
from tests.test_neighbours import _dense, _random_csr


def _reference_pass(X, Y, order, W, b, alpha, C):
    """One pass of dual coordinate descent (Hsieh et al. 2008, L2-loss SVM, the bias as a
    feature of value 1), one label after another, in float64."""
    D = 0.5 / C
    for k in range(W.shape[1]):
        for i in order:
            y = 1.0 if Y[i, k] else -1.0
            grad = y * (X[i] @ W[:, k] + b[k]) - 1.0 + D * alpha[i, k]
            new = max(alpha[i, k] - grad / (X[i] @ X[i] + 1.0 + D), 0.0)
            d = (new - alpha[i, k]) * y
            alpha[i, k] = new
            W[:, k] += d * X[i]
            b[k] += d


def _problem(seed=0, n_rows=120, n_features=40, n_labels=7):
    rng = np.random.default_rng(seed)
    X = _random_csr(rng, n_rows, n_features, 6)
    Y = _random_csr(rng, n_rows, n_labels, 3, binary=True)
    Xd = _dense(X)
    Xd /= np.linalg.norm(Xd, axis=1, keepdims=True)
    return X, Y, Xd, _dense(Y) > 0


def _kernel_inputs(X: CSR, Y: CSR, Xd: np.ndarray):
    ptr, idx = X.indptr.astype(np.int64), X.indices.astype(np.int64)
    val = np.concatenate([Xd[i, X.row(i)] for i in range(X.n_rows)]).astype(np.float32)
    y_ptr, y_idx = _columns_of(Y, np.arange(Y.n_cols))
    return ptr, idx, val, (Xd * Xd).sum(axis=1).astype(np.float32), y_ptr, y_idx


@pytest.mark.parametrize("n_blocks", [1, 3])
def test_lockstep_passes_equal_label_by_label_descent(n_blocks):
    X, Y, Xd, Yd = _problem()
    ptr, idx, val, sq, y_ptr, y_idx = _kernel_inputs(X, Y, Xd)
    K = Y.n_cols
    W, b, alpha = np.zeros((X.n_cols, K), np.float32), np.zeros(K, np.float32), None
    alpha = np.zeros((X.n_rows, K), np.float32)
    W_ref, b_ref, a_ref = np.zeros((X.n_cols, K)), np.zeros(K), np.zeros((X.n_rows, K))
    rng = np.random.default_rng(1)
    for _ in range(3):
        order = rng.permutation(X.n_rows)
        label_svm.dcd_pass(ptr, idx, val, sq, y_ptr, y_idx, order, W, b, alpha, 0.5, n_blocks)
        _reference_pass(Xd, Yd, order, W_ref, b_ref, a_ref, 0.5)
    np.testing.assert_allclose(W, W_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(alpha, a_ref, rtol=1e-4, atol=1e-5)


def test_the_weights_are_the_dual_solution_and_it_converges():
    X, Y, Xd, Yd = _problem(seed=2)
    ptr, idx, val, sq, y_ptr, y_idx = _kernel_inputs(X, Y, Xd)
    K, C = Y.n_cols, 1.0
    W, b = np.zeros((X.n_cols, K), np.float32), np.zeros(K, np.float32)
    alpha = np.zeros((X.n_rows, K), np.float32)
    rng = np.random.default_rng(3)
    gaps = []
    for _ in range(60):
        order = rng.permutation(X.n_rows)
        label_svm.dcd_pass(ptr, idx, val, sq, y_ptr, y_idx, order, W, b, alpha, C, 2)
        y = np.where(Yd, 1.0, -1.0)
        margin = y * (Xd @ W + b)
        primal = 0.5 * (W**2).sum(0) + 0.5 * b**2 + C * (np.maximum(0, 1 - margin) ** 2).sum(0)
        dual = alpha.sum(0) - 0.5 * (W**2).sum(0) - 0.5 * b**2 - (alpha**2).sum(0) / (4 * C)
        gaps.append((primal - dual).max())
    # w = sum_i alpha_i y_i x_i and b = sum_i alpha_i y_i: the primal of the dual variables
    y = np.where(Yd, 1.0, -1.0)
    np.testing.assert_allclose(W, Xd.T @ (alpha * y), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(b, (alpha * y).sum(0), rtol=1e-3, atol=1e-4)
    assert gaps[-1] < 1e-3 * gaps[0] and gaps[-1] < 1e-2, gaps[-1]  # the duality gap closes


def test_the_classifiers_keep_the_frequent_labels_and_vote_as_dense_scoring():
    X, Y, _, _ = _problem(seed=4, n_rows=300, n_features=60, n_labels=20)
    counts = np.bincount(Y.indices, minlength=Y.n_cols)
    min_count = int(np.sort(counts)[-8])
    fitted = LabelClassifiers.fit(X, Y, min_count, max_labels=5, seed=0)
    assert fitted is not None
    frequent = np.flatnonzero(counts >= min_count)
    kept = frequent[np.argsort(-counts[frequent], kind="stable")[:5]]
    np.testing.assert_array_equal(fitted.labels, np.sort(kept))
    W = np.zeros((X.n_cols, 5))
    for f in range(X.n_cols):
        lo, hi = fitted.w_ptr[f], fitted.w_ptr[f + 1]
        W[f, fitted.w_col[lo:hi]] = fitted.w_val[lo:hi]
    Q = _random_csr(np.random.default_rng(5), 30, 60, 6)
    Qd = _dense(Q)
    Qd /= np.linalg.norm(Qd, axis=1, keepdims=True)
    want = np.exp(-(np.maximum(0, 1 - (Qd @ W + fitted.bias)) ** 2))
    ids, scores = fitted.votes(Q, 8)  # more asked than classified: padded
    assert ids.shape == (30, 8) and np.all(ids[:, 5:] == -1) and np.all(scores[:, 5:] == 0)
    for i in range(30):
        order = np.argsort(-want[i], kind="stable")
        np.testing.assert_allclose(scores[i, :5], want[i, order], rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(np.sort(ids[i, :5]), fitted.labels)
    assert LabelClassifiers.fit(X, Y, int(counts.max()) + 1, 5, 0) is None


def test_a_label_seen_with_its_own_feature_is_ranked_first():
    """Two features, each the sign of one label: a classifier a label learns it."""
    rng = np.random.default_rng(6)
    n = 400
    which = rng.integers(0, 2, n)
    rows = [np.array(sorted({int(w), 2 + int(rng.integers(0, 20))})) for w in which]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    X = CSR(indptr, np.concatenate(rows), None, 22)
    Y = CSR(np.arange(n + 1), which.astype(np.int64), None, 2)
    fitted = LabelClassifiers.fit(X, Y, 1, 10, 0)
    ids, _ = fitted.votes(X, 1)
    assert (ids[:, 0] == which).mean() == 1.0


def test_the_same_classifiers_whatever_the_threads():
    X, Y, _, _ = _problem(seed=7, n_rows=200, n_labels=9)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = LabelClassifiers.fit(X, Y, 1, 9, 0)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = LabelClassifiers.fit(X, Y, 1, 9, 0)
    finally:
        numba.set_num_threads(before)
    for name, array in one.state().items():
        np.testing.assert_array_equal(array, two.state()[name], err_msg=name)


def test_damaged_arrays_are_named():
    X, Y, _, _ = _problem(seed=8)
    fitted = LabelClassifiers.fit(X, Y, 1, 5, 0)
    state = fitted.state()
    again = LabelClassifiers.from_state(state, Y.n_cols)
    for name, array in again.state().items():
        np.testing.assert_array_equal(array, state[name])
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        LabelClassifiers.from_state(state, 3)
    with pytest.raises(ValueError, match="w_col must lie"):
        LabelClassifiers.from_state({**state, "w_col": state["w_col"] + 99}, Y.n_cols)
    with pytest.raises(ValueError, match="w_ptr must start at 0"):
        LabelClassifiers.from_state({**state, "w_ptr": state["w_ptr"][::-1]}, Y.n_cols)


def test_labels_trained_in_groups_are_the_labels_trained_at_once(monkeypatch):
    X, Y, _, _ = _problem(seed=9, n_rows=150, n_labels=11)
    at_once = LabelClassifiers.fit(X, Y, 1, 11, 0)
    monkeypatch.setattr(label_classifiers, "GROUP_BYTES", 4 * (X.n_cols + X.n_rows) * 4)
    grouped = LabelClassifiers.fit(X, Y, 1, 11, 0)  # 4 labels a group: 3 groups
    for name, array in at_once.state().items():
        np.testing.assert_allclose(grouped.state()[name], array, rtol=1e-5, err_msg=name)

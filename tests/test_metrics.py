"""XC metrics against direct numpy references and hand-computed cases."""

import math

import numpy as np
import pytest

from dslide_dask.data import CSR
from dslide_dask.metrics import (
    add_sums,
    label_counts,
    metric_sums,
    metrics_of_sums,
    ndcg_at_k,
    precision_at_k,
    propensity,
    psndcg_at_k,
    psp_at_k,
    xc_metrics,
)

KS = (1, 2, 3, 5, 7)


def csr_of(rows: list[list[int]], n_labels: int) -> CSR:
    indptr = np.cumsum([0, *map(len, rows)]).astype(np.int64)
    indices = np.array([lab for r in rows for lab in r], np.int32)
    return CSR(indptr, indices, None, n_labels)


def random_case(seed: int, n: int = 300, n_labels: int = 40, width: int = 7):
    """Random label sets (some empty, some larger than k) and random top-k rows with
    repeated labels and -1 (no prediction) mixed in."""
    rng = np.random.default_rng(seed)
    rows = [
        sorted(rng.choice(n_labels, rng.integers(0, 12), replace=False).tolist()) for _ in range(n)
    ]
    topk = rng.integers(-1, n_labels, (n, width))
    topk[: n // 2] = np.argsort(rng.random((n // 2, n_labels)), axis=1)[:, :width]  # distinct
    return rows, topk


def dense(rows, n_labels):
    Y = np.zeros((len(rows), n_labels))
    for i, r in enumerate(rows):
        Y[i, r] = 1
    return Y


def hit(Y, i, label):
    return Y[i, label] if label >= 0 else 0.0


def ref_precision(rows, topk, n_labels, k):
    Y = dense(rows, n_labels)
    return np.mean([sum(hit(Y, i, topk[i, j]) for j in range(k)) / k for i in range(len(rows))])


def ideal(n_pos, k):
    return sum(1 / math.log2(r + 2) for r in range(min(k, max(n_pos, 1))))


def ref_ndcg(rows, topk, n_labels, k):
    Y = dense(rows, n_labels)
    out = []
    for i, r in enumerate(rows):
        dcg = sum(hit(Y, i, topk[i, j]) / math.log2(j + 2) for j in range(k))
        out.append(dcg / ideal(len(r), k) if r else 0.0)
    return np.mean(out)


def ref_ps(rows, topk, n_labels, p, k, discounted):
    """(sum over rows of the prediction's score, of the best prediction's score)."""
    Y = dense(rows, n_labels)
    disc = [1 / math.log2(j + 2) if discounted else 1.0 for j in range(k)]
    got = top = 0.0
    for i, r in enumerate(rows):
        norm = ideal(len(r), k) if discounted else 1.0
        got += sum(hit(Y, i, topk[i, j]) / p[topk[i, j]] * disc[j] for j in range(k)) / norm
        best = sorted((1 / p[lab] for lab in r), reverse=True)[:k]
        top += sum(g * disc[j] for j, g in enumerate(best)) / norm
    return got / top


@pytest.mark.parametrize("seed", range(4))
def test_metrics_equal_a_direct_reference_on_random_data(seed):
    n_labels = 40
    rows, topk = random_case(seed, n_labels=n_labels)
    Y = csr_of(rows, n_labels)
    # few distinct counts: many labels share a propensity (ties in the best top-k)
    counts = np.random.default_rng(seed).integers(0, 4, n_labels) * 5
    p = propensity(counts, 1000)
    P, N = precision_at_k(topk, Y, KS), ndcg_at_k(topk, Y, KS)
    PSP, PSN = psp_at_k(topk, Y, p, KS), psndcg_at_k(topk, Y, p, KS)
    for k in KS:
        assert P[f"P@{k}"] == pytest.approx(ref_precision(rows, topk, n_labels, k), rel=1e-12)
        assert N[f"nDCG@{k}"] == pytest.approx(ref_ndcg(rows, topk, n_labels, k), rel=1e-12)
        want = ref_ps(rows, topk, n_labels, p, k, discounted=False)
        assert PSP[f"PSP@{k}"] == pytest.approx(want, rel=1e-12)
        want = ref_ps(rows, topk, n_labels, p, k, discounted=True)
        assert PSN[f"PSnDCG@{k}"] == pytest.approx(want, rel=1e-12)


def test_hand_computed_cases():
    Y = csr_of([[0, 2], [1], []], 4)
    topk = np.array([[2, 1, 0], [3, 1, 2], [0, 1, 2]])
    assert precision_at_k(topk, Y, (1, 3)) == pytest.approx({"P@1": 1 / 3, "P@3": 3 / 9})
    # row 0: (1 + 1/log2 4) / (1 + 1/log2 3); row 1: (1/log2 3) / 1; row 2: 0
    row0 = 1.5 / (1 + 1 / math.log2(3))
    assert ndcg_at_k(topk, Y, (3,))["nDCG@3"] == pytest.approx((row0 + 1 / math.log2(3)) / 3)
    # 1/p = 2, 4, 1, 1: best top-1 gains 2 (row 0) + 4 (row 1); predicted 1 (label 2) + 0
    p = np.array([0.5, 0.25, 1.0, 1.0])
    assert psp_at_k(topk, Y, p, (1,))["PSP@1"] == pytest.approx(1 / 6)
    # top-3: predicted 1 + 2 (row 0) + 4 (row 1) = best 2 + 1 + 4
    assert psp_at_k(topk, Y, p, (3,))["PSP@3"] == pytest.approx(1.0)


def test_perfect_prediction_scores_one_and_ranks_rare_labels_first_for_psp():
    Y = csr_of([[0, 1], [0, 1]], 2)
    p = np.array([0.9, 0.3])  # label 1 is the rarer
    rare_first, common_first = np.array([[1, 0], [1, 0]]), np.array([[0, 1], [0, 1]])
    assert psp_at_k(rare_first, Y, p, (1, 2)) == pytest.approx({"PSP@1": 1.0, "PSP@2": 1.0})
    assert psp_at_k(common_first, Y, p, (1,))["PSP@1"] == pytest.approx(0.3 / 0.9)
    assert ndcg_at_k(common_first, Y, (1, 2)) == pytest.approx({"nDCG@1": 1.0, "nDCG@2": 1.0})


def test_propensity_is_the_formula_with_the_given_a_and_b():
    counts = np.array([0, 1, 7, 1000])
    for A, B in ((0.55, 1.5), (0.6, 2.6), (0.5, 0.4)):
        C = (math.log(5000) - 1) * (B + 1) ** A
        want = [1 / (1 + C * (n + B) ** -A) for n in counts]
        np.testing.assert_allclose(propensity(counts, 5000, A, B), want, rtol=1e-14)
    p = propensity(counts, 5000)
    assert np.all(np.diff(p) > 0) and np.all((p > 0) & (p < 1))  # rarer: less observed
    assert p[2] == pytest.approx(0.206834, abs=1e-6)  # N=5000, N_l=7, A=0.55, B=1.5 by hand


def test_label_counts_counts_rows_per_label():
    Y = csr_of([[0, 3], [3], [], [1, 3]], 5)
    assert label_counts(Y).tolist() == [1, 1, 0, 3, 0]


def test_xc_metrics_keys_and_propensities_from_training_counts():
    rows, topk = random_case(7, n=50, n_labels=20, width=5)
    Y = csr_of(rows, 20)
    plain = xc_metrics(topk, Y)
    assert list(plain) == ["P@1", "P@3", "P@5", "nDCG@1", "nDCG@3", "nDCG@5"]
    counts = label_counts(Y)
    full = xc_metrics(topk, Y, label_counts=counts, n_train=50, A=0.6, B=2.6)
    p = propensity(counts, 50, 0.6, 2.6)
    assert full["PSP@3"] == psp_at_k(topk, Y, p, (3,))["PSP@3"]
    assert full["PSnDCG@5"] == psndcg_at_k(topk, Y, p, (5,))["PSnDCG@5"]
    with pytest.raises(ValueError, match="n_train"):
        xc_metrics(topk, Y, label_counts=counts)


def test_bad_inputs_are_refused():
    Y = csr_of([[0]], 3)
    with pytest.raises(ValueError, match="k must be"):
        ndcg_at_k(np.array([[0, 1]]), Y, (3,))
    with pytest.raises(ValueError, match="one value per label"):
        psp_at_k(np.array([[0]]), Y, np.ones(2), (1,))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        psp_at_k(np.array([[0]]), Y, np.zeros(3), (1,))


def test_metrics_equal_napkinxc_implementation():
    """An independent implementation (napkinXC's, when installed) gives the same values."""
    nm = pytest.importorskip("napkinxc.metrics")
    scipy_sparse = pytest.importorskip("scipy.sparse")
    rows, _ = random_case(11, n=400, n_labels=50)
    topk = np.argsort(np.random.default_rng(11).random((400, 50)), axis=1)[:, :5]  # no -1
    Y, pred, ks = csr_of(rows, 50), topk.tolist(), (1, 2, 3, 4, 5)
    Ys = scipy_sparse.csr_matrix((np.ones(Y.nnz), Y.indices, Y.indptr), shape=(400, 50))
    inv_p = nm.Jain_et_al_inverse_propensity(Ys)
    np.testing.assert_allclose(1 / propensity(label_counts(Y), 400), inv_p, rtol=1e-12)
    p = 1 / inv_p
    pairs = [
        (nm.precision_at_k(rows, pred, 5), precision_at_k(topk, Y, ks)),
        (nm.ndcg_at_k(rows, pred, 5), ndcg_at_k(topk, Y, ks)),
        (nm.psprecision_at_k(rows, pred, inv_p, 5), psp_at_k(topk, Y, p, ks)),
        (nm.psndcg_at_k(rows, pred, inv_p, 5), psndcg_at_k(topk, Y, p, ks)),
    ]
    for want, got in pairs:
        np.testing.assert_allclose(list(got.values()), want, rtol=1e-9)


def test_metric_sums_of_row_blocks_add_up_to_the_whole():
    """A cluster scores its partitions apart: their sums, added, give every metric of
    all the rows at once (an empty block adds nothing)."""
    rng = np.random.default_rng(3)
    Y = csr_of([sorted(rng.choice(40, rng.integers(0, 4), replace=False)) for _ in range(90)], 40)
    top = np.stack([rng.permutation(40)[:7] for _ in range(90)])
    top[5, 4:] = -1
    counts = label_counts(Y) + 1
    want = xc_metrics(top, Y, KS, counts, 200)
    blocks = [(0, 0), (0, 31), (31, 32), (32, 90)]
    p = propensity(counts, 200)
    total = add_sums(metric_sums(top[a:b], Y.slice_rows(a, b), KS, p) for a, b in blocks)
    got = metrics_of_sums(total)
    assert set(got) == set(want) and total["rows"] == 90
    assert got == pytest.approx(want, abs=1e-12)
    assert metrics_of_sums(metric_sums(top, Y, KS)) == pytest.approx(xc_metrics(top, Y, KS))

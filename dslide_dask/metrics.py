"""Ranking metrics for extreme classification, as the Extreme Classification Repository
reports them: P@k, nDCG@k, and propensity-scored PSP@k and PSnDCG@k (Jain, Prabhu and
Varma, KDD 2016).

Everything works from the predicted top-k label ids and the CSR label matrix; nothing is
densified (label counts reach millions). Over 400 lines: the metrics, their sums over row
blocks (:func:`metric_sums`, what a cluster adds up) and the answers with pairs left out
share one set of scoring helpers, so that a cluster's figures and this process's cannot
drift apart. A point without labels scores 0 in every metric
and still counts in the mean, as in the repository's own evaluation code (pyxclib). Each
predicted position is scored on its own, so predictions should be distinct within a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numba
import numpy as np

from dslide_dask.data.csr import CSR, as_csr

#: The XC Repository's default propensity parameters (Amazon sets use 0.6/2.6,
#: Wikipedia sets 0.5/0.4).
PROPENSITY_A, PROPENSITY_B = 0.55, 1.5


@numba.njit(cache=True, nogil=True)
def _hits(topk: np.ndarray, y_indptr: np.ndarray, y_indices: np.ndarray) -> np.ndarray:
    """hits[i, j] = 1 if topk[i, j] is one of row i's labels."""
    n, k = topk.shape
    hits = np.zeros((n, k), np.float64)
    for i in range(n):
        lo, hi = y_indptr[i], y_indptr[i + 1]
        for j in range(k):
            for p in range(lo, hi):
                if y_indices[p] == topk[i, j]:
                    hits[i, j] = 1.0
                    break
    return hits


@numba.njit(cache=True, nogil=True)
def _best_gains(
    y_indptr: np.ndarray, y_indices: np.ndarray, gain: np.ndarray, k: int
) -> np.ndarray:
    """best[i, :] = the k largest gains among row i's labels, largest first (0-padded):
    the gains of the best possible top-k prediction for row i."""
    n = len(y_indptr) - 1
    best = np.zeros((n, k), np.float64)
    for i in range(n):
        for p in range(y_indptr[i], y_indptr[i + 1]):
            g = gain[y_indices[p]]
            j = k  # insertion into the sorted row, dropping the smallest
            while j > 0 and best[i, j - 1] < g:
                if j < k:
                    best[i, j] = best[i, j - 1]
                j -= 1
            if j < k:
                best[i, j] = g
    return best


def _check(topk: np.ndarray, Y: CSR, ks: Iterable[int]) -> tuple[np.ndarray, list[int]]:
    topk = np.ascontiguousarray(topk, dtype=np.int64)
    ks = sorted(set(int(k) for k in ks))
    if topk.ndim != 2 or topk.shape[0] != Y.n_rows:
        raise ValueError(f"topk must be ({Y.n_rows}, k), got {topk.shape}")
    if ks and (ks[0] < 1 or ks[-1] > topk.shape[1]):
        raise ValueError(f"k must be in [1, {topk.shape[1]}], got {ks}")
    return topk[:, : ks[-1]] if ks else topk, ks


def _discount(k: int) -> np.ndarray:
    """1 / log2(rank + 1) for ranks 1..k."""
    return 1.0 / np.log2(np.arange(2, k + 2))


def _ideal_dcg(Y: CSR, k: int) -> np.ndarray:
    """Each row's best DCG@1..k with unit gains: the sum of the first min(k, |labels|)
    discounts (rows without labels get 1, so their DCG of 0 divides safely)."""
    ideal = np.cumsum(_discount(k))
    n_labels = np.diff(Y.indptr)
    cols = np.minimum.outer(np.maximum(n_labels, 1), np.arange(1, k + 1)) - 1
    return ideal[cols]


def _inverse(propensities: np.ndarray, Y: CSR) -> np.ndarray:
    p = np.asarray(propensities, np.float64)
    if p.shape != (Y.n_cols,):
        raise ValueError(f"propensities must have one value per label ({Y.n_cols}), got {p.shape}")
    if not np.all((p > 0) & (p <= 1)):
        raise ValueError("propensities must be in (0, 1]")
    return 1.0 / p


def _ps_gains(topk: np.ndarray, Y: CSR, inv_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gains of the prediction, gains of the best prediction): 1/p_l where label l is
    right, for the predicted and the best possible top-k."""
    hits = _hits(topk, Y.indptr, Y.indices)
    gains = hits * inv_p[np.maximum(topk, 0)]  # -1 (no prediction) is never a hit
    return gains, _best_gains(Y.indptr, Y.indices, inv_p, topk.shape[1])


def precision_at_k(topk: np.ndarray, Y: CSR, ks: Iterable[int] = (1, 3, 5)) -> dict[str, float]:
    """P@k for each k in ``ks``: the mean fraction of the top k predictions that are true.

    Parameters
    ----------
    topk : ndarray of shape (n_rows, max(ks))
        Each row's predicted label ids, best first (-1: none).
    Y : CSR
        The true labels of the rows.
    ks : iterable of int, default=(1, 3, 5)
        The cut-offs k.

    Returns
    -------
    dict of str to float
        ``{'P@1': ..., 'P@3': ..., ...}``.
    """
    return _family(metric_sums(topk, Y, ks), "P")


def ndcg_at_k(topk: np.ndarray, Y: CSR, ks: Iterable[int] = (1, 3, 5)) -> dict[str, float]:
    """nDCG@k: DCG@k = sum over ranks r <= k of [label right] / log2(r + 1), divided by
    the best DCG@k the row's labels allow, averaged over rows."""
    return _family(metric_sums(topk, Y, ks), "nDCG")


def psp_at_k(
    topk: np.ndarray, Y: CSR, propensities: np.ndarray, ks: Iterable[int] = (1, 3, 5)
) -> dict[str, float]:
    """Propensity-scored P@k, normalised: each right label counts 1/p_l (rare labels
    weigh more), and the sum over all rows is divided by the same sum for the best
    possible top-k (each row's own labels, highest 1/p_l first), as the XC Repository
    reports it. 1.0 is the best achievable; it is not comparable with unnormalised PSP.

    ``propensities``: p_l for every label, from :func:`propensity` on training counts.
    """
    return _family(metric_sums(topk, Y, ks, propensities), "PSP")


def psndcg_at_k(
    topk: np.ndarray, Y: CSR, propensities: np.ndarray, ks: Iterable[int] = (1, 3, 5)
) -> dict[str, float]:
    """Propensity-scored nDCG@k, normalised like :func:`psp_at_k`: each row's DCG with
    gains 1/p_l over its unit-gain ideal DCG, averaged, divided by the same for the best
    possible top-k (as pyxclib's ``psndcg``)."""
    return _family(metric_sums(topk, Y, ks, propensities), "PSnDCG")


def _family(sums: dict[str, float], name: str) -> dict[str, float]:
    """One metric's ``name@k`` for each k summed, of :func:`metric_sums`' sums."""
    return {m: v for m, v in metrics_of_sums(sums).items() if m.partition("@")[0] == name}


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b > 0 else float("nan")  # no test row has a label


def label_counts(Y: CSR) -> np.ndarray:
    """How many rows of ``Y`` carry each label (N_l of the propensity model)."""
    return np.bincount(Y.indices, minlength=Y.n_cols)


def propensity(
    label_counts: np.ndarray, n_points: int, A: float = PROPENSITY_A, B: float = PROPENSITY_B
) -> np.ndarray:
    """Jain et al.'s label propensities p_l = 1 / (1 + C (N_l + B)^-A), with
    C = (ln N - 1)(B + 1)^A: the chance that a relevant label is observed, lower for rare
    labels. ``label_counts`` are the N_l of the training set, ``n_points`` its N."""
    if n_points < 1:
        raise ValueError(f"n_points must be >= 1, got {n_points}")
    counts = np.asarray(label_counts, np.float64)
    C = (np.log(n_points) - 1.0) * (B + 1.0) ** A
    return 1.0 / (1.0 + C * (counts + B) ** -A)


def xc_metrics(
    topk: np.ndarray,
    Y: CSR,
    ks: Iterable[int] = (1, 3, 5),
    label_counts: np.ndarray | None = None,
    n_train: int | None = None,
    A: float = PROPENSITY_A,
    B: float = PROPENSITY_B,
) -> dict[str, float]:
    """The metrics the CLI and benchmarks print.

    Parameters
    ----------
    topk : ndarray of shape (n_rows, max(ks))
        Each row's predicted label ids, best first (-1: none).
    Y : CSR
        The true labels of the rows.
    ks : iterable of int, default=(1, 3, 5)
        The cut-offs k.
    label_counts : ndarray of shape (n_labels,) or None, default=None
        Training rows of each label (:func:`label_counts`), for the propensities.
    n_train : int or None, default=None
        Training rows, for the propensities.
    A, B : float, default=0.55, 1.5
        The propensity model's parameters (:func:`propensity`).

    Returns
    -------
    dict of str to float
        ``P@k`` and ``nDCG@k`` for each k and, with ``label_counts`` and ``n_train``,
        ``PSP@k`` and ``PSnDCG@k``.
    """
    p = None
    if label_counts is not None:
        if n_train is None:
            raise ValueError("PSP@k needs n_train (training points) with label_counts")
        p = propensity(label_counts, n_train, A, B)
    return metrics_of_sums(metric_sums(topk, Y, ks, p))


def metric_sums(
    topk: np.ndarray, Y: CSR, ks: Iterable[int], propensities: np.ndarray | None = None
) -> dict[str, float]:
    """What :func:`xc_metrics` divides, summed over the rows (``rows``, and each PS
    metric's best beside it; PSP@k and PSnDCG@k with ``propensities``): blocks of rows
    scored apart, a cluster's partitions, add up (:func:`add_sums`), and
    :func:`metrics_of_sums` of the total is :func:`xc_metrics` of all the rows."""
    topk, ks = _check(topk, Y, ks)
    width = topk.shape[1]
    hits = _hits(topk, Y.indptr, Y.indices)
    cum = np.cumsum(hits, axis=1)
    ideal = _ideal_dcg(Y, width)
    ndcg = np.cumsum(hits * _discount(width), axis=1) / ideal
    out = {"rows": float(Y.n_rows)}
    out.update({f"P@{k}": float(cum[:, k - 1].sum() / k) for k in ks})
    out.update({f"nDCG@{k}": float(ndcg[:, k - 1].sum()) for k in ks})
    if propensities is not None:
        gains, best = _ps_gains(topk, Y, _inverse(propensities, Y))
        sums = {
            "PSP": (gains.sum(axis=0).cumsum(), best.sum(axis=0).cumsum()),
            "PSnDCG": tuple(
                (np.cumsum(g * _discount(width), axis=1) / ideal).sum(axis=0) for g in (gains, best)
            ),
        }
        for name, (got, top) in sums.items():
            for k in ks:
                out[f"{name}@{k}"], out[f"{name}@{k} best"] = float(got[k - 1]), float(top[k - 1])
    return out


def add_sums(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    """The :func:`metric_sums` of several blocks of rows, added (no block: no rows)."""
    parts = list(parts)
    return {name: sum(p[name] for p in parts) for name in parts[0]} if parts else {"rows": 0.0}


def metrics_of_sums(sums: dict[str, float]) -> dict[str, float]:
    """The metrics of :func:`metric_sums`' sums (of one block, or added over several)."""
    rows, out = sums["rows"], {}
    for name, value in sums.items():
        if name == "rows" or name.endswith(" best"):
            continue
        if name.startswith("PS"):
            out[name] = _ratio(value, sums[f"{name} best"])
        else:
            out[name] = float(value / rows) if rows else float("nan")
    return out


class TrainingLabels:
    """How often each label occurred in the rows a model trained on: the N_l and N of
    PSP@k's propensities, gathered as batches go by (training data streamed from storage
    are never counted in a separate pass).

    Over several passes the counts are divided by the passes made (rows trained over the
    training set's size), so they are those of one pass."""

    def __init__(self, n_labels: int) -> None:
        self.counts = np.zeros(n_labels, np.int64)
        self.rows = 0
        self.n_points = 0

    def add(self, Y: CSR) -> None:
        """Count one training batch's labels."""
        np.add.at(self.counts, Y.indices, 1)
        self.rows += Y.n_rows

    def metric_args(self) -> dict:
        """``label_counts`` and ``n_train`` for :func:`xc_metrics` (empty before any
        training: PSP@k is then not reported)."""
        if self.rows == 0 or self.n_points == 0:
            return {}
        return {"label_counts": self.counts * (self.n_points / self.rows), "n_train": self.n_points}


#: The most labels a row may leave out of its answer: every row's answer is widened by
#: the most any row leaves out (rows x that many ids), so one row's list sizes the whole.
MAX_EXCLUDED = 1000


def widest_exclusion(exclude: CSR) -> int:
    """The most labels a row of ``exclude`` leaves out, at most :data:`MAX_EXCLUDED`."""
    return widest_count(np.diff(exclude.indptr))


def widest_count(counts: np.ndarray, rows: np.ndarray | None = None) -> int:
    """The largest of the labels each row leaves out (``counts``, of the ``rows`` named,
    else of rows 0, 1, ...), at most :data:`MAX_EXCLUDED`."""
    widest = int(counts.max(initial=0))
    if widest > MAX_EXCLUDED:
        at = int(np.argmax(counts))
        row = int(rows[at]) if rows is not None else at
        raise ValueError(
            f"row {row} leaves {widest:,} labels out of its answer, more than the "
            f"{MAX_EXCLUDED:,} a row may: every row's answer is widened by the most any "
            "row leaves out"
        )
    return widest


def widened(k: int, widest: int, n_labels: int) -> int:
    """How many answers a row is asked for so that ``k`` are left once it drops up to
    ``widest`` labels: at most the model's ``n_labels`` (unless ``k`` is past them, for
    the caller's own check to refuse)."""
    return min(k + widest, max(k, n_labels))


def excluded_pairs(exclude, n_rows: int, n_labels: int, rows_of: str = "Y") -> CSR:
    """``evaluate``'s ``exclude`` (label sets as ``Y`` gives them) as a pattern matrix of
    the ``n_rows`` rows of ``rows_of`` (the argument an error names)."""
    gone = as_csr(exclude, n_labels, pattern=True, name="exclude")
    if gone.n_rows != n_rows:
        raise ValueError(f"exclude has {gone.n_rows:,} rows, {rows_of} {n_rows:,}: one a row")
    return gone


def topk_without(topk_of: Callable[[int], np.ndarray], exclude: CSR, k: int) -> np.ndarray:
    """The ``k`` best ids a row keeps once ``exclude``'s labels are left out of the answer
    ``topk_of(width)`` gives: asked for ``k`` plus the most labels any row leaves out."""
    width = widened(k, widest_exclusion(exclude), exclude.n_cols)
    return drop_pairs(np.asarray(topk_of(width)), exclude, k)


def drop_pairs(topk: np.ndarray, exclude: CSR, k: int) -> np.ndarray:
    """Each row's ids of ``topk`` without the labels ``exclude`` gives that row (the
    XC Repository's ``filter_labels_test.txt``), the first ``k`` left, best first (-1
    past the end). ``topk`` should hold ``k`` plus the most any row excludes."""
    order, dropped = _kept(topk, exclude, k)
    return np.where(dropped, -1, np.take_along_axis(topk, order, axis=1))


def drop_scored_pairs(
    ids: np.ndarray, scores: np.ndarray, exclude: CSR, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`drop_pairs` with each id's score kept beside it (``-inf`` past the end)."""
    order, dropped = _kept(ids, exclude, k)
    kept = np.take_along_axis(scores, order, axis=1)
    return (
        np.where(dropped, -1, np.take_along_axis(ids, order, axis=1)),
        np.where(dropped, np.float32(-np.inf), kept).astype(scores.dtype, copy=False),
    )


def _kept(topk: np.ndarray, exclude: CSR, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row, the positions of the first ``k`` answers ``exclude`` keeps (then the
    dropped ones), and whether each of those is dropped. Only the rows with pairs (or
    with an answer missing among their first ``k``) are searched: most rows keep their
    first ``k`` as they are."""
    if exclude.n_rows != len(topk):
        raise ValueError(
            f"the excluded pairs cover {exclude.n_rows:,} rows, the answers {len(topk):,}"
        )
    width = min(k, topk.shape[1])
    order = np.broadcast_to(np.arange(width), (len(topk), width)).copy()
    dropped = topk[:, :width] < 0
    work = np.flatnonzero((np.diff(exclude.indptr) > 0) | dropped.any(axis=1))
    if len(work):
        some, gone = topk[work], exclude.take_rows(work)
        n = np.int64(max(gone.n_cols, int(some.max(initial=-1)) + 1))
        rows = np.repeat(np.arange(len(work), dtype=np.int64), np.diff(gone.indptr))
        keys = np.arange(len(work), dtype=np.int64)[:, None] * n + some
        out = (some < 0) | np.isin(keys, rows * n + gone.indices)
        order[work] = np.argsort(out, axis=1, kind="stable")[:, :width]  # kept ids first
        dropped[work] = np.take_along_axis(out, order[work], axis=1)
    return order, dropped


def most_frequent_topk(Y: CSR, n_rows: int, k: int) -> np.ndarray:
    """The baseline prediction: the k most frequent labels of ``Y`` for each of ``n_rows``
    rows."""
    top = np.argsort(-label_counts(Y), kind="stable")[:k]
    return np.broadcast_to(top, (n_rows, k))


def topk_indicator(top: np.ndarray, n_labels: int):
    """Top-k label ids ``[rows, k]`` (-1: none) as scikit-learn's multi-label indicator:
    a scipy CSR matrix of ``n_labels`` columns, never dense."""
    import scipy.sparse

    counts = (top >= 0).sum(axis=1)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    # each row's ids sorted (scipy's canonical form), the -1s of exact=False dropped
    ids = np.sort(np.where(top >= 0, top, n_labels), axis=1)
    ids = ids[np.arange(top.shape[1]) < counts[:, None]]
    data = np.ones(len(ids), np.int8)
    return scipy.sparse.csr_matrix((data, ids, indptr), shape=(len(top), n_labels))

"""How the network's scores and the neighbours' votes make one ranking.

:func:`fused_topk` mixes the network's softmax over its top candidates with both votes,
``(1 - a - b) * p + a * share_input + b * share_hidden``, and :func:`choose_weights`
picks ``(a, b)`` on rows the network did not train on: where the network generalises it
keeps a share, where labels are too rare for it the neighbours take over.

Both sources still favour frequent labels (the softmax learned their priors, and a
frequent label sits among more neighbours), so a label's fused score is multiplied by its
inverse propensity to a power ``tail`` (``p_l ** -tail``, Jain et al.'s propensity from
the training counts, the one PSP@k weighs by): a logit adjustment that lifts rare labels.
Chosen with the weights; on all three sets measured it raised P@1 as well as PSP@k
(docs/accuracy.md).

Two more sources come on top, each with a weight of its own: the frequent labels'
classifiers' scores and the cosines of a row with its candidates' label centroids (which
lift rare labels better than the tail boost: with them, the default boost is 0).
"""

from __future__ import annotations

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import fusion as kernels

#: Weights (input neighbours, hidden neighbours) :func:`choose_weights` tries: a 0.1 grid
#: over the triangle a + b <= 1 (the network gets the rest).
WEIGHTS = tuple((round(0.1 * a, 1), round(0.1 * b, 1)) for a in range(11) for b in range(11 - a))
#: Exponents of the inverse propensity :func:`choose_weights` tries (0: no tail boost).
TAILS = (0.0, 0.1, 0.2, 0.3, 0.4)
#: Weights of the label classifiers' scores (a third list of votes, added on top of the
#: rest) that :func:`choose_weights` tries. Not past 0.75: held rows, with near-twins
#: among the training rows the classifiers learned, over-rate them (Debian-26K: 1.0
#: chosen there, where the test rows' best was 0.25-0.5; debian-files' 0.75-1.0).
CLASSIFIER_WEIGHTS = (0.0, 0.25, 0.5, 0.75)
#: Weights of the label centroids' cosines (a fourth list, on top like the classifiers')
#: that :func:`choose_weights` tries when asked to: held rows over-rate them (a fit
#: gives them 0.5 unless told otherwise; docs/accuracy.md).
CENTROID_WEIGHTS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
#: How much better than the prior weights (mean of P@1, P@3 and P@5, times the square
#: root of the held rows) the best must score to replace them.
MARGIN = 0.5


def softmax_of_top(logits: np.ndarray) -> np.ndarray:
    """The network's probabilities, the softmax over each row's top logits (-inf: none)."""
    if not logits.shape[1]:  # the network not asked: what the steps below give, sooner
        return np.zeros(logits.shape, np.float32)
    top = np.where(np.isfinite(logits), logits, -np.inf).astype(np.float64)
    top -= np.max(np.where(np.isfinite(top), top, -1e300), axis=1, keepdims=True, initial=-1e300)
    p = np.exp(top)
    return (p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)).astype(np.float32)


def fused_topk(
    net_ids: np.ndarray,
    net_logits: np.ndarray,
    votes: list[tuple[np.ndarray, np.ndarray]],
    weights: tuple[float, ...],
    k: int,
    tail: float = 0.0,
    inverse_propensity: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best labels of each row by ``((1 - sum(weights)) * p_network + sum of
    weights[i] * share_i) * inverse_propensity ** tail`` over the votes given (weights
    past them ignored), and those scores (-inf where fewer than ``k`` labels were found)."""
    weights = (*weights, *(0.0,) * (len(votes) - len(weights)))  # a list unweighed: 0
    w = _source_weights(weights[: len(votes)])
    lists = [(net_ids, softmax_of_top(net_logits)), *votes]
    if any(i.shape != v.shape or len(i) != len(net_ids) for i, v in lists):
        raise ValueError("every candidate list needs one score an id and one row a query row")
    labels = tuple(_kernel_array(i, np.int64) for i, _ in lists)
    values = tuple(_kernel_array(v, np.float32, copy=bool(tail)) for _, v in lists)
    if tail:  # boosted copies: the callers' lists stay
        if inverse_propensity is None:
            raise ValueError("a tail boost needs the labels' inverse propensities")
        for i, v in zip(labels, values, strict=True):
            _boost(i, v, inverse_propensity, tail)
    return kernels.fuse(labels, values, w, k)


def tree_rescored(
    ids: np.ndarray, scores: np.ndarray, losses: np.ndarray, power: float, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of each row's fused candidates (``ids``, -1: none; ``scores``) once
    each score is multiplied by its label tree likelihood to ``power``:
    ``exp(-power * losses)``, ``losses`` the squared hinge losses on the label's path."""
    if not ids.shape == scores.shape == losses.shape:
        raise ValueError(f"ids {ids.shape}, scores {scores.shape}, losses {losses.shape}")
    return kernels.rescored_top(ids, scores, np.exp(-np.float32(power) * losses), k)


def filled(
    ids: np.ndarray, scores: np.ndarray, rows: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Copies of a top-k (``ids``, -1 past a row's answers; ``scores``) whose ``rows``
    are completed from ``labels`` in order, below every answer the row had."""
    ids, scores = ids.copy(), scores.copy()
    kernels.fill_short(ids, scores, _kernel_array(rows, np.int64), _kernel_array(labels, np.int64))
    return ids, scores


def choose_weights(
    net_ids: np.ndarray,
    net_logits: np.ndarray,
    votes: list[tuple[np.ndarray, np.ndarray]],
    Y: CSR,
    inverse_propensity: np.ndarray | None = None,
    weights: tuple[float, float] | None = None,
    tail: float | None = None,
    centroid: float | None = None,
    prior: tuple[tuple[float, ...], float] | None = None,
) -> tuple[tuple[float, ...], float]:
    """The weights of :data:`WEIGHTS` (input, hidden; the hidden one 0 when only the
    input's votes are given), one of :data:`CLASSIFIER_WEIGHTS` for a third votes list
    (the label classifiers') and one of :data:`CENTROID_WEIGHTS` for a fourth (the label
    centroids'), with the tail exponent of :data:`TAILS` (0 without
    ``inverse_propensity``), whose fused top 5 scores best on rows with true labels ``Y``
    (mean of P@1, P@3, P@5; the first tried on a tie, smaller exponents first).
    ``weights`` (the first two), ``tail`` or ``centroid`` given: only that one is tried.
    ``prior`` (weights, tail) is kept unless the best beats it by :data:`MARGIN` over the
    square root of the rows: a few held rows choose by noise. Each setting is scored on
    the candidates a served model asks for under it (:func:`asked`): a source it weighs
    0 is not asked, so the labels only that source lists are no candidates then.

    The centroids' weight is chosen in turn, not over the whole grid (five times the
    work): the others at its 0, then it with the tail, then the others again."""
    labels, values, listed = _union(*_stacked(net_ids, net_logits, votes))
    found = labels >= 0
    hits = np.where(found, _hits(labels, Y), -1).astype(np.int8)
    boosted_by: dict[float, np.ndarray] = {}
    offered_by: dict[tuple[bool, ...], np.ndarray] = {}

    def served_hits(weight: tuple[float, ...]) -> np.ndarray:
        """``hits`` with the candidates only unasked sources list marked SKIP."""
        key = asked(weight, len(votes))
        if key not in offered_by:
            lists = [s for s, yes in enumerate(key) if yes]
            keep = listed[lists].any(axis=0) | (hits < 0)
            offered_by[key] = np.where(keep, hits, kernels.SKIP).astype(np.int8)
        return offered_by[key]

    def score(candidate: tuple[tuple[float, ...], float]) -> float:
        weight, exponent = candidate
        if exponent not in boosted_by:
            boosted_by[exponent] = values
            if exponent:
                if inverse_propensity is None:
                    raise ValueError("a tail boost needs the labels' inverse propensities")
                factor = inverse_propensity[np.where(found, labels, 0)] ** np.float32(exponent)
                boosted_by[exponent] = values * factor
        w = _source_weights(weight[: len(votes)])
        ranks = kernels.hits_by_rank(boosted_by[exponent], served_hits(weight), w, 5)
        return _mean_precision(ranks, len(labels))

    pairs = WEIGHTS if weights is None else (weights,)
    if len(votes) < 2 or votes[1][0].shape[1] == 0:  # no hidden votes to weigh
        pairs = tuple(pair for pair in pairs if pair[1] == 0) if weights is None else pairs
    offered = [len(votes) > s and votes[s][0].shape[1] > 0 for s in (2, 3)]
    classifier = CLASSIFIER_WEIGHTS if offered[0] else (0.0,)
    centroid_grid = CENTROID_WEIGHTS if centroid is None else (centroid,)
    centroid_grid = centroid_grid if offered[1] else (0.0,)
    tails = (tail,) if tail is not None else TAILS if inverse_propensity is not None else (0.0,)
    n_weights = max(2, min(len(votes), 4))

    def others(c: float, exponents: tuple[float, ...]) -> list:
        return [
            ((*pair, w, c)[:n_weights], t) for t in exponents for w in classifier for pair in pairs
        ]

    best = _first_best(others(centroid_grid[0], tails), score)
    if len(centroid_grid) > 1:
        weight = best[0][0]
        turn = [((*weight[:3], c), t) for c in centroid_grid for t in tails]
        best = _first_best(turn, score, best)
        weight, exponent = best[0]
        best = _first_best(others(weight[3], (exponent,)), score, best)
    if prior is not None:
        kept = ((*prior[0], 0.0, 0.0)[:n_weights], prior[1])
        if best[1] - score(kept) < MARGIN / np.sqrt(max(len(labels), 1)):
            return kept
    return best[0]


def _first_best(candidates: list, score, best=None) -> tuple:
    """``(candidate, score)`` of the best scoring candidate (the first on a tie), or
    ``best`` when none beats it."""
    for candidate in candidates:
        value = score(candidate)
        if best is None or value > best[1] + 1e-12:
            best = (candidate, value)
    return best


def asked(weight: tuple[float, ...], n_votes: int) -> tuple[bool, ...]:
    """Which lists of :func:`_stacked` a served model asks for under ``weight`` (the
    network's, then the votes' as :meth:`~dslide_dask.model.fused.FusedModel.votes`
    asks them): the network while the votes leave it a share, the input's and hidden
    votes when weighed, the label classifiers unless weighed 0. The centroids list no
    candidates of their own (they score the others'): never."""
    w = (*weight, *(1.0,) * (3 - len(weight)))  # the classifiers: asked unless weighed 0
    flags = (sum(w[:2]) < 1.0, w[0] > 0, w[1] > 0, w[2] > 0, False)
    return flags[: n_votes + 1]


def candidate_union(net_ids: np.ndarray, votes: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Each row's distinct labels over the network's and the votes' lists (-1 past a
    row's), as wide as the row with the most: the candidates a centroid scores."""
    flat = np.concatenate([net_ids, *(ids for ids, _ in votes)], axis=1)
    out = np.sort(flat, axis=1)
    out[:, 1:][out[:, 1:] == out[:, :-1]] = -1
    out = -np.sort(-out, axis=1)  # descending: the -1s last
    return np.ascontiguousarray(out[:, : int((out >= 0).sum(axis=1).max(initial=0))])


def _union(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's candidates over all sources, once: ``(n, width)`` label ids (-1 past
    a row's), ``(sources, n, width)`` each source's score of them (0 where it did not
    list the label) and whether it listed them. Weighing the sources is then one product
    per weight tried, where :func:`~dslide_dask.kernels.fusion.fuse` would gather and
    sort again."""
    n_sources, n, m = ids.shape
    flat = ids.transpose(1, 0, 2).reshape(n, n_sources * m)
    order = np.argsort(flat, axis=1, kind="stable")
    sorted_ids = np.take_along_axis(flat, order, 1)
    new = np.ones(sorted_ids.shape, bool)
    new[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    new &= sorted_ids >= 0
    slot = np.cumsum(new, axis=1) - 1  # the union slot of each sorted entry
    labels = np.full(flat.shape, -1, np.int64)
    rows = np.broadcast_to(np.arange(n)[:, None], flat.shape)
    labels[rows[new], slot[new]] = sorted_ids[new]
    values = np.zeros((n_sources, *flat.shape), np.float32)
    source = order // m  # the entry's source, in the row's flattened order
    keep = sorted_ids >= 0
    flat_scores = scores.transpose(1, 0, 2).reshape(n, n_sources * m)
    where = (source[keep], rows[keep], slot[keep])
    np.add.at(values, where, np.take_along_axis(flat_scores, order, 1)[keep])
    listed = np.zeros(values.shape, bool)
    listed[where] = True
    return labels, values, listed


def _hits(labels: np.ndarray, Y: CSR) -> np.ndarray:
    """Whether each ``labels[i, j]`` is one of row ``i``'s labels in ``Y``."""
    width = np.int64(Y.n_cols) + 1
    truth = np.repeat(np.arange(Y.n_rows, dtype=np.int64), np.diff(Y.indptr)) * width
    keys = np.arange(labels.shape[0], dtype=np.int64)[:, None] * width + labels
    return np.isin(keys, truth + Y.indices)


def _mean_precision(hits_by_rank: np.ndarray, n_rows: int) -> float:
    """Mean of P@1, P@3 and P@5 from the rows' right labels at each rank of their top 5."""
    got = np.cumsum(hits_by_rank)
    return float(np.mean([got[k - 1] / (k * max(n_rows, 1)) for k in (1, 3, 5)]))


def _stacked(
    net_ids: np.ndarray, net_logits: np.ndarray, votes: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The network's softmax and each list of votes as one ``(sources, rows, m)`` array
    of ids (-1: none) and one of scores, for :func:`~dslide_dask.kernels.fusion.fuse`."""
    lists = [(net_ids, softmax_of_top(net_logits)), *votes]
    n, m = net_ids.shape[0], max(ids.shape[1] for ids, _ in lists)
    ids = np.full((len(lists), n, m), -1, np.int64)
    scores = np.zeros((len(lists), n, m), np.float32)
    for s, (i, v) in enumerate(lists):
        ids[s, :, : i.shape[1]] = i
        scores[s, :, : v.shape[1]] = v
    return ids, scores


def _kernel_array(a: np.ndarray, dtype: type, copy: bool = False) -> np.ndarray:
    """``a`` as a writeable C array of ``dtype`` (a copy only if it is not, or ``copy``):
    the lists passed to :func:`~dslide_dask.kernels.fusion.fuse` together must be of one
    type."""
    if copy:
        return np.array(a, dtype, order="C")  # always a new array
    out: np.ndarray = np.ascontiguousarray(a, dtype)
    return out if out.flags.writeable else out.copy()


def _boost(ids: np.ndarray, scores: np.ndarray, inverse_propensity: np.ndarray, tail: float):
    """Multiply each candidate's score by its label's ``inverse_propensity ** tail`` (in
    place): fusing is linear, so boosting every source's score boosts the sum."""
    found = ids >= 0
    scores[found] *= inverse_propensity[ids[found]] ** np.float32(tail)


def _source_weights(weights: tuple[float, ...]) -> np.ndarray:
    """The network's weight before the votes' own: the rest of 1 after the neighbours'
    two (the label classifiers' and centroids' weights, a third and a fourth, come on
    top: their scores are no shares of one whole)."""
    return np.array([1.0 - sum(weights[:2]), *weights], np.float32)

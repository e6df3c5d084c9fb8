"""``SlideEnsemble``: differently seeded models whose top-k lists are fused.

Models that differ only in their seed (initial weights, hash functions, dropout masks,
batch order) make different mistakes, and a sparse model is cheap enough to train
several. Their predictions are fused by a Borda count over each member's top
``k_fuse`` labels: it needs nothing but each member's ranked label ids, so a member may
live in this process or on a cluster, and fusing costs ``n_models x k_fuse`` entries a
row, whatever the number of labels. (On the Debian set, three members of two epochs: the
Borda count of their top 10 reaches P@1 0.8538 where averaging their full softmax
outputs reaches 0.8552; see docs/benchmarks.md.)
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils import check_random_state

from dslide_dask.data.inputs import labelled_data
from dslide_dask.estimator import SlideClassifier
from dslide_dask.metrics import (
    excluded_pairs,
    label_counts,
    topk_indicator,
    topk_without,
    xc_metrics,
)
from dslide_dask.model.config import check_int
from dslide_dask.not_fitted import NotFittedError


def borda_topk(member_topk: list[np.ndarray], k: int) -> np.ndarray:
    """Fuse ranked label ids by a Borda count.

    A label scores ``k_fuse - rank`` in each member's list it is in; a row's fused list
    is the ``k`` best of the summed scores, ties to the label first seen in member order.

    Parameters
    ----------
    member_topk : list of ndarray of shape (n_rows, k_fuse)
        Each member's label ids, best first, -1 for none.
    k : int
        Labels to keep per row.

    Returns
    -------
    ndarray of shape (n_rows, k)
        The fused label ids, best first, -1 where fewer than ``k`` were found.
    """
    ids = np.concatenate(member_topk, axis=1).astype(np.int64)
    points = np.concatenate(
        [np.broadcast_to(np.arange(t.shape[1], 0, -1), t.shape) for t in member_topk], axis=1
    ).astype(np.int64)
    width = ids.shape[1]
    order = np.argsort(ids, axis=1, kind="stable")  # equal ids together, first seen first
    ids = np.take_along_axis(ids, order, axis=1)
    total = np.cumsum(np.take_along_axis(points, order, axis=1), axis=1)
    last = np.ones(ids.shape, bool)  # the last entry of each run of one label
    last[:, :-1] = ids[:, 1:] != ids[:, :-1]
    first = np.ones(ids.shape, bool)
    first[:, 1:] = last[:, :-1]
    # a label's score: the running total at its run's end minus the total before its run
    before = np.where(first, total - np.take_along_axis(points, order, axis=1), 0)
    before = np.maximum.accumulate(before * first, axis=1)
    score = np.where(last & (ids >= 0), total - before, 0)
    # first-seen position of the run, for ties: carried from the run's first entry
    seen = np.maximum.accumulate(np.where(first, np.arange(width), 0), axis=1)
    position = np.take_along_axis(order, seen, axis=1)
    key = score * (width + 1) + (width - position)
    best = np.argsort(-key, axis=1, kind="stable")[:, :k]
    out = np.take_along_axis(ids, best, axis=1)
    out[np.take_along_axis(score, best, axis=1) == 0] = -1
    return out


class SlideEnsemble(BaseEstimator):
    """Differently seeded multi-label classifiers whose top-k lists are fused.

    ``n_models`` copies of ``estimator`` are trained one after another on the same data,
    the i-th seeded ``random_state + i``; their predictions are fused by
    :func:`borda_topk` over each member's top ``k_fuse`` labels. The fusion needs only
    each member's ranked label ids, so members may live in this process or on a cluster
    (each member uses its client as a :class:`~dslide_dask.estimator.SlideClassifier`
    does).

    Several short runs buy P@1 that one longer run does not: on the Debian set three
    members of two epochs reach P@1 0.850 in 59 s where one model of five epochs reaches
    0.844 in 48 s (P@3/P@5 do not gain: the Borda count flattens the tail).

    Parameters
    ----------
    estimator : SlideClassifier or None, default=None
        The member to copy (``clone``), its parameters those of every member but the
        seed. None: a :class:`~dslide_dask.estimator.SlideClassifier` with its defaults.
    n_models : int, default=3
        Members to train, in [1, 1000].
    k_fuse : int or None, default=None
        Labels of each member's top list that the Borda count fuses, in [k, n_labels]
        for a prediction of ``k`` labels. None: ``max(10, 2 * k)``.

    Attributes
    ----------
    members_ : list of SlideClassifier
        The fitted members, in training order; the i-th seeded ``random_state + i``
        when the estimator's ``random_state`` is an int, else by seeds drawn from it.
    label_counts_ : ndarray of shape (n_labels,)
        Training rows of each label: the propensities of ``PSP@k``, as the members
        have them.
    n_train_ : int
        Training rows.

    See Also
    --------
    dslide_dask.estimator.SlideClassifier : One model, and the members' parameters.
    borda_topk : The fusion of ranked label ids.

    Examples
    --------
    >>> from dslide_dask import SlideClassifier
    >>> from dslide_dask.data import make_synthetic
    >>> from dslide_dask.ensemble import SlideEnsemble
    >>> train, test = make_synthetic("tiny")
    >>> ensemble = SlideEnsemble(SlideClassifier(epochs=1), n_models=2)
    >>> ensemble = ensemble.fit(train.X, train.Y)
    >>> ensemble.predict_topk(test.X, k=5).shape
    (1000, 5)
    """

    def __init__(
        self,
        estimator: SlideClassifier | None = None,
        *,
        n_models: int = 3,
        k_fuse: int | None = None,
    ) -> None:
        self.estimator = estimator
        self.n_models = n_models
        self.k_fuse = k_fuse

    def fit(self, X, Y, callback=None) -> SlideEnsemble:
        """Train every member on ``(X, Y)``, one after another.

        Parameters
        ----------
        X : sparse matrix or array-like
            The features, ``(n_samples, n_features)``, in memory (scipy, pydata/sparse,
            :class:`~dslide_dask.data.CSR` or numpy).
        Y : sparse matrix, array-like or list of arrays
            The labels: a 0/1 indicator matrix ``(n_samples, n_labels)`` or a list of
            label-id arrays.
        callback : callable or None, default=None
            Called as ``callback(i, ensemble)`` after the i-th member is trained, e.g. to
            score the ensemble so far.

        Returns
        -------
        self : SlideEnsemble
            The fitted ensemble.
        """
        check_int("n_models", self.n_models, 1, 1000)
        data = labelled_data(X, Y)
        base = self.estimator if self.estimator is not None else SlideClassifier()
        rs = base.random_state
        seeds: np.ndarray
        if isinstance(rs, numbers.Integral):
            seeds = int(rs) + np.arange(self.n_models)
        else:  # None or a RandomState: members' seeds drawn from it
            seeds = check_random_state(rs).randint(0, 1 << 31, self.n_models)
        self.label_counts_ = label_counts(data.Y)  # PSP@k's propensities, as members have
        self.n_train_ = data.n_points
        self.members_ = []
        for i in range(self.n_models):
            member = clone(base).set_params(random_state=int(seeds[i]))
            member.fit(data.X, data.Y)
            self.members_.append(member)
            if callback is not None:
                callback(i, self)
        return self

    def predict_topk(self, X, k: int = 5, *, exact: bool = True) -> np.ndarray:
        """The ``k`` best label ids of each row, best first, by the members' fused ranks.

        Parameters
        ----------
        X : sparse matrix or array-like
            The rows, ``(n_samples, n_features)``.
        k : int, default=5
            Labels per row, in [1, n_labels].
        exact : bool, default=True
            Members score every label; False: only those their LSH tables retrieve.

        Returns
        -------
        ndarray of shape (n_samples, k)
            Label ids (int64), -1 where the members found fewer than ``k``.
        """
        self._check_fitted()
        n_labels = self._n_labels
        check_int("k", k, 1, n_labels)
        k_fuse = self.k_fuse if self.k_fuse is not None else max(10, 2 * k)
        check_int("k_fuse", k_fuse, k, n_labels)
        return borda_topk([m.predict_topk(X, k_fuse, exact=exact) for m in self.members_], k)

    def predict(self, X, top_k: int = 1, *, exact: bool = True):
        """The ``top_k`` best labels of each row as a scipy CSR indicator matrix.

        As :meth:`SlideClassifier.predict <dslide_dask.estimator.SlideClassifier.predict>`
        of a multi-label model.

        Parameters
        ----------
        X : sparse matrix or array-like
            The rows, ``(n_samples, n_features)``.
        top_k : int, default=1
            Labels set per row.
        exact : bool, default=True
            Members score every label; False: only those their LSH tables retrieve.

        Returns
        -------
        scipy.sparse.csr_matrix of shape (n_samples, n_labels)
            The indicator matrix with the ``top_k`` best labels of each row set.
        """
        return topk_indicator(self.predict_topk(X, top_k, exact=exact), self._n_labels)

    def evaluate(self, X, Y, ks=(1, 3, 5), *, exact: bool = True, exclude=None) -> dict[str, float]:
        """The extreme classification metrics of the fused predictions for ``X``.

        Parameters
        ----------
        X : sparse matrix or array-like
            The rows, ``(n_samples, n_features)``.
        Y : sparse matrix, array-like or list of arrays
            Their true labels.
        ks : tuple of int, default=(1, 3, 5)
            The cut-offs k.
        exact : bool, default=True
            Members score every label; False: only those their LSH tables retrieve.
        exclude : like ``Y``, or None, default=None
            Labels left out of each row's answers before they are scored (the XC
            Repository's ``filter_labels_test.txt``), ``Y``'s shape.

        Returns
        -------
        dict of str to float
            ``P@k``, ``nDCG@k``, ``PSP@k`` and ``PSnDCG@k`` for each k (propensities
            from the training labels).
        """
        self._check_fitted()
        data = labelled_data(X, Y, self._n_labels)
        if exclude is None:
            top = self.predict_topk(data.X, max(ks), exact=exact)
        else:
            gone = excluded_pairs(exclude, data.n_points, self._n_labels)
            top = topk_without(lambda k: self.predict_topk(data.X, k, exact=exact), gone, max(ks))
        return xc_metrics(top, data.Y, ks, self.label_counts_, self.n_train_)

    def score(self, X, Y, sample_weight=None, *, k: int = 1, exact: bool = True) -> float:
        """Precision at k (P@k) on ``(X, Y)``: scikit-learn's ``score``.

        Parameters
        ----------
        X : sparse matrix or array-like
            The rows, ``(n_samples, n_features)``.
        Y : sparse matrix, array-like or list of arrays
            Their true labels.
        sample_weight : None
            Not supported (P@k weighs every row alike): must be None.
        k : int, default=1
            The predictions scored per row.
        exact : bool, default=True
            Members score every label; False: only those their LSH tables retrieve.

        Returns
        -------
        float
            P@k of the fused predictions.
        """
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported: P@k weighs every row alike")
        return self.evaluate(X, Y, ks=(k,), exact=exact)[f"P@{k}"]

    def close(self) -> None:
        """Release every member's model."""
        for member in getattr(self, "members_", []):
            member.close()

    @property
    def _n_labels(self) -> int:
        return self.members_[0].trainer_.n_labels

    def _check_fitted(self) -> None:
        if not getattr(self, "members_", None):
            raise NotFittedError(
                "This SlideEnsemble instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )

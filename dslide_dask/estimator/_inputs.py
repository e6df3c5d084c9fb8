"""How ``SlideClassifier`` reads what users pass: features as CSR (numpy, scipy and
array-likes through scikit-learn's own checks; sparse arrays, CSR, Dask collections as
they are), labels as multi-class classes or multi-label sets, parameters as plain
Python numbers. One place, so fit, partial_fit, evaluate and predict read input alike.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np
from sklearn.utils.multiclass import type_of_target

from dslide_dask.data.batches import plan
from dslide_dask.data.csr import CSR, as_csr
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.inputs import labelled_data
from dslide_dask.estimator import _sklearn, collections
from dslide_dask.estimator._state import EstimatorState

if TYPE_CHECKING:
    from dslide_dask.distributed.cluster_data import ClusterData
    from dslide_dask.estimator._state import TrainingData


class InputsMixin(EstimatorState):
    """The input conversions of :class:`SlideClassifier` (they set ``n_features_in_``,
    ``classes_`` and whether the model is multi-class)."""

    def _training_data(self, X, Y, storage_options, classes=None) -> TrainingData:
        """What ``fit`` trains on, with ``n_features_in_``, ``classes_`` set; a URL is
        planned (streamed later), anything else made a data set in memory."""
        if isinstance(X, str):
            if Y is not None:
                raise ValueError("with a URL as X the labels come from the file: Y must be None")
            source = plan(X, storage_options)
            self._multiclass = False
            self.classes_ = np.arange(source.n_labels)
            self.n_features_in_ = source.n_features
            return source
        if Y is None and not collections.is_rows(X):
            raise ValueError(
                "SlideClassifier requires y to be passed, but the target y is None (Y may be "
                "None only for a URL, a dask bag of (x, labels) rows or a dask dataframe)"
            )
        if collections.is_rows(X) or (
            collections.is_dask_collection(X) and collections.is_dask_collection(Y)
        ):
            data = self._collection_data(X, Y, self._current_client())
            self._multiclass = False
            self.classes_ = np.arange(data.n_labels)
            self.n_features_in_ = data.n_features
            if data.n_labels < 2:
                raise ValueError(
                    f"Y has {data.n_labels} label: at least 2 are needed to learn to tell "
                    "them apart"
                )
            return data
        Xc = self._features(X, reset=True)
        Y = self._labels_for_fit(Y, classes)
        return labelled_data(Xc, Y, len(self.classes_))

    def _collection_data(self, X, Y, client) -> XCDataset | ClusterData:
        """Dask collections (rows, or 2-D arrays ``X`` and ``Y``) as a data set: with a
        ``client``, its blocks made and kept on the cluster for the model there, else
        computed and stacked here."""
        blocks = collections.dataset_blocks(X, Y)
        if client is None:
            data = collections.dataset_here(blocks)
            return labelled_data(data.X, data.Y)
        from dslide_dask.distributed.cluster_data import ClusterData

        return ClusterData.persist(client, blocks)

    def _features(self, X, *, reset: bool) -> CSR:
        """``X`` as CSR: numpy, scipy and array-likes through scikit-learn's own checks
        (``n_features_in_``); sparse arrays, CSR and Dask arrays converted as they are."""
        if isinstance(X, str):
            raise ValueError(
                "X is a URL: only fit and partial_fit read data from storage; read the rows "
                "first (dslide_dask.data.read_xc)"
            )
        if collections.is_dask_collection(X):
            Xc = collections.csr_here(X, "X")
        elif isinstance(X, CSR) or type(X).__module__.startswith("sparse"):
            Xc = as_csr(X, name="X")
        else:
            Xc = as_csr(_sklearn.validate_data(self, X, reset=reset), name="X")
            return Xc
        if reset:
            self.n_features_in_ = Xc.n_cols
        elif Xc.n_cols != self.n_features_in_:
            raise ValueError(
                f"X has {Xc.n_cols} features, the model was fitted with {self.n_features_in_}"
            )
        return Xc

    def _labels_for_fit(self, Y, classes=None):
        """Multi-class (a 1-D ``y``: ``classes_``, or the ``classes`` given, and their
        ids) or multi-label; at least two of them to learn to tell apart."""
        y = _one_d(Y)
        if y is not None:
            self._multiclass = True
            self.classes_ = np.unique(y if classes is None else np.asarray(classes))
            Y = self._labels(y)
        else:
            self._multiclass = False
            if collections.is_dask_collection(Y):
                Y = collections.csr_here(Y, "Y", pattern=True)
            elif not _is_sparse(Y) and hasattr(Y, "__array__"):
                Y = np.asarray(Y)
            Y = as_csr(Y, pattern=True, name="Y")
            self.classes_ = np.arange(Y.n_cols)
        if len(self.classes_) < 2:
            raise ValueError(
                f"y has {len(self.classes_)} class (label): at least 2 classes are needed "
                "to learn to tell them apart"
            )
        return Y

    def _labels(self, Y, name: str = "Y"):
        """Labels to score against the fitted model: class labels mapped to their ids
        (``name``: the argument errors name)."""
        if self._multiclass:
            classes = _one_d(Y)
            if classes is None:
                raise ValueError("this model was fitted on one class per row: y must be 1-D")
            ids = np.minimum(np.searchsorted(self.classes_, classes), len(self.classes_) - 1)
            known = self.classes_[ids] == classes
            # a class the model does not know is a row with no label (never predicted)
            indptr = np.concatenate([[0], np.cumsum(known)])
            return CSR(indptr, ids[known], None, len(self.classes_))
        if collections.is_dask_collection(Y):
            return collections.csr_here(Y, name, pattern=True, n_cols=len(self.classes_))
        if not _is_sparse(Y) and hasattr(Y, "__array__"):
            return np.asarray(Y)
        return Y

    def _held_out(self, eval_set, n_labels: int) -> XCDataset:
        X, Y = eval_set
        return labelled_data(self._features(X, reset=False), self._labels(Y), n_labels)


def _plain(value):
    """numpy scalars and arrays as the Python values they stand for: ``np.int64(2)`` is 2
    (grids built with ``np.arange``), ``np.array([8, 4])`` the widths ``(8, 4)``."""
    if isinstance(value, np.ndarray):
        return tuple(_plain(v) for v in value.tolist()) if value.ndim else value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    return value


def _one_d(Y):
    """``Y`` as a 1-D array of classes if it is one (multi-class: a 1-D array or list of
    classes, or a column), else None (multi-label); targets no classifier can learn
    (continuous, several classes per output) raise scikit-learn's error."""
    if Y is None:
        raise ValueError("SlideClassifier requires y to be passed, but the target y is None")
    if isinstance(Y, str) or collections.is_dask_collection(Y) or _is_sparse(Y):
        return None
    if isinstance(Y, list | tuple) and not all(
        isinstance(v, numbers.Number | str | np.generic) for v in Y
    ):
        return None  # rows of label ids (or of a 0/1 indicator): multi-label
    if not hasattr(Y, "__array__") and not isinstance(Y, list | tuple):
        return None
    arr = np.asarray(Y)
    if arr.ndim == 0 or len(arr) == 0:
        raise ValueError(f"y has no rows: there is nothing to train on (got {Y!r:.60})")
    kind = type_of_target(arr, input_name="y")
    if kind in ("binary", "multiclass"):
        return arr.ravel()
    if kind == "multilabel-indicator":
        return None
    raise ValueError(
        f"Unknown label type: {kind}. y must be classes (1-D), a 0/1 label indicator "
        "matrix or a list of label-id arrays"
    )


def _is_sparse(Y) -> bool:
    """scipy, pydata/sparse or CSR."""
    return isinstance(Y, CSR) or hasattr(Y, "tocsr") or type(Y).__module__.startswith("sparse")

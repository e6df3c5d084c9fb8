"""What a fitted ``SlideClassifier`` does: top-k inference (``predict`` kept sparse,
``predict_topk`` with scores), P@k scores, and saving and loading the model."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Self

import numpy as np

from dslide_dask.checkpoint import open_checkpoint
from dslide_dask.checkpoint.fused import check_fused, load_fused, save_fused
from dslide_dask.checkpoint.label_counts import give_labels, load_label_counts, parts_with_labels
from dslide_dask.checkpoint.model import config_of
from dslide_dask.estimator import collections
from dslide_dask.estimator._filtered import filtered_metrics, filtered_topk
from dslide_dask.estimator._inputs import _plain
from dslide_dask.estimator._state import EstimatorState
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.metrics import topk_indicator
from dslide_dask.model.config import check_int

if TYPE_CHECKING:
    from dslide_dask.distributed import DistributedTrainer


def _classes_of(classes: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Label ids as the classes they stand for (None where no label was found)."""
    out = classes[np.maximum(top, 0)]
    if (top < 0).any():
        out = out.astype(object)
        out[top < 0] = None
    return out


class FittedMixin(EstimatorState):
    """Inference and persistence of :class:`SlideClassifier`."""

    # -- persistence -----------------------------------------------------------------------
    def save(self, url: str, storage_options: dict | None = None) -> str:
        """Write the fitted model to a folder: plain arrays and JSON, no pickle.

        On a cluster, every shard writes its own rows from its worker. The parameters,
        ``evals_``, the classes and the neighbour index are saved with the weights;
        :meth:`load` reads them back.

        Parameters
        ----------
        url : str
            The folder, on any fsspec URL (a local path, ``s3://...``).
        storage_options : dict or None, default=None
            fsspec options of ``url`` (credentials, endpoint...).

        Returns
        -------
        str
            The URL of the checkpoint written.
        """
        self._check_fitted()
        params = {k: _plain(v) for k, v in self.get_params().items() if k != "hidden"}
        params["random_state"] = self.seed_  # the seed used, whatever drew it
        extra = {"estimator": {**params, "epochs_done": self.epochs_done_, "evals": self.evals_}}
        if self._multiclass:
            extra["estimator"]["classes"] = self.classes_.tolist()
        built = getattr(self, "_fused_parts", None)  # built where the model is: saved there
        fused = None if built is not None else self.fused_model()

        def parts(folder_url: str, meta: dict) -> dict:  # written before the commit
            self._save_output_index(folder_url, meta, storage_options)
            if built is not None:
                return built.parts(storage_options)(folder_url, meta)
            return {} if fused is None else save_fused(folder_url, fused, storage_options)

        return self.trainer_.save(
            url, storage_options, extra, parts_with_labels(self.trainer_, storage_options, parts)
        )

    @classmethod
    def load(
        cls,
        url: str,
        client=None,
        storage_options: dict | None = None,
        n_shards: int | None = None,
        *,
        answering: bool = False,
    ) -> Self:
        """A fitted classifier from a model written by :meth:`save`.

        Any checkpoint loads (e.g. a run folder's latest), whatever the sharding it was
        written with.

        Parameters
        ----------
        url : str
            The model's folder (or a checkpoint store or run folder), on any fsspec URL.
        client : distributed.Client or None, default=None
            Load the model onto this client's cluster. None: in this process.
        storage_options : dict or None, default=None
            fsspec options of ``url``.
        n_shards : int or None, default=None
            Shards to split the output layer into. None: as saved, in this process;
            one per worker, on a cluster.
        answering : bool, default=False
            Load it to answer only, without the optimiser state (a third to a half of
            the network's memory, here or on each worker of ``client``): the
            classifier then predicts, but refuses :meth:`partial_fit` and :meth:`save`.

        Returns
        -------
        SlideClassifier
            The fitted estimator, with the parameters it was saved with.

        Raises
        ------
        CheckpointError
            The folder holds no model, or a corrupted or incompatible one.
        """
        ckpt = open_checkpoint(url, storage_options)
        saved = dict(ckpt.meta.get("estimator", {}))
        epochs_done, evals = saved.pop("epochs_done", 0), saved.pop("evals", [])
        saved.pop("neighbour_weight_", None)  # saved before the fusion block: load_fused's
        saved.pop("tail_exponent_", None)
        classes = saved.pop("classes", None)
        saved.setdefault("neighbour_mix", 0.0)  # saved before it: the hidden space alone
        saved.setdefault("label_classifiers", 0)  # saved before them: none
        saved.setdefault("label_centroids", 0.0)  # likewise
        saved.setdefault("label_tree", 0.0)  # likewise
        saved.setdefault("n_label_trees", 1)  # saved before it: one
        if "seed" in saved:  # saved before the parameter was random_state
            saved["random_state"] = saved.pop("seed")
        names = cls._get_param_names()
        params = {k: v for k, v in saved.items() if k in names}
        # what the user set wins over what a fit derived from it (the schedule's length)
        recipe = config_of(ckpt).to_dict()
        recipe["random_state"] = recipe.pop("seed")
        clf = cls(**{**recipe, **params}).set_params(
            hidden=tuple(ckpt.meta["config"]["hidden"]), n_shards=n_shards
        )
        clf.client = client
        n_features, n_labels = ckpt.meta["n_features"], ckpt.meta["n_labels"]
        cfg = clf.config()
        if client is None:
            clf.trainer_ = LocalTrainer(
                cfg, n_features, n_labels, n_shards or 1, restore=ckpt, answering=answering
            )
        else:
            from dslide_dask.distributed import DistributedTrainer  # distributed: on demand

            clf.trainer_ = DistributedTrainer(
                client,
                cfg,
                n_features,
                n_labels,
                n_shards=n_shards,
                wire_dtype=clf.wire_dtype,
                pipeline=clf.pipeline,
                restore=ckpt.url,
                storage_options=storage_options,
                answering=answering,
                name=clf.run_name,
            )
        give_labels(clf.trainer_, load_label_counts(ckpt, storage_options))  # PSP@k's
        clf.seed_ = cfg.seed
        clf.epochs_done_, clf.evals_ = epochs_done, list(evals)
        clf.n_features_in_ = n_features
        clf._multiclass = classes is not None
        clf.classes_ = np.asarray(classes) if classes is not None else np.arange(n_labels)
        clf._held, clf._index_rows = None, None
        fusion = check_fused(ckpt)  # from meta.json alone
        clf.neighbours_, clf.neighbour_weight_, clf.tail_exponent_ = None, None, None
        if fusion is not None:  # the model's own settings (a CLI model has no estimator's)
            clf.neighbour_weight_, clf.tail_exponent_ = fusion.weight, fusion.tail
            clf.set_params(neighbours=fusion.k, neighbour_mix=fusion.mix,
                           label_tree=fusion.tree_power)  # fmt: skip
            if client is None:
                fused = load_fused(ckpt, storage_options)
                clf.neighbours_ = None if fused is None else fused.index
            else:  # read by a worker of the model, kept there (never on the client)
                from dslide_dask.distributed.fused_build import RemoteFused

                clf._fused_parts = RemoteFused.load(client, clf.trainer_, ckpt.url, storage_options)
        clf._load_output_index(ckpt)
        return clf

    # -- inference -------------------------------------------------------------------------
    def predict_topk(
        self, X, k: int = 5, *, exact: bool = True, return_scores: bool = False, exclude=None
    ):
        """The ``k`` best labels of each row, best first, optionally with their scores.

        A dask array ``X`` given to a model on a cluster gives a dask array of the whole
        model's answer: one task per block, run on the worker that holds the fused parts
        a fit on the cluster built there (a model without them: where the block is, its
        network asked). Fused parts in this process (a fit of rows in memory) read ``X``
        here and numpy arrays come back, as with ``return_scores``.

        Parameters
        ----------
        X : sparse matrix, array-like or dask array
            The rows, ``(n_samples, n_features)``.
        k : int, default=5
            Labels per row, in [1, n_labels].
        exact : bool, default=True
            Score every label. False: only those the LSH tables retrieve (faster, and
            -1, or None for classes, where fewer than ``k`` are found).
        return_scores : bool, default=False
            Also return the labels' scores.
        exclude : like ``Y``, LabelPairs or None, default=None
            Labels each row may not answer (the XC Repository's
            ``filter_labels_test.txt``, read by
            :func:`~dslide_dask.data.label_pairs.read_label_pairs` or ``read_pairs``),
            one row a row of ``X``: each row's ``k`` best of the rest (a multi-label
            model only).

        Returns
        -------
        labels : ndarray or dask array of shape (n_samples, k)
            Label ids (int64), or the classes of a multi-class model.
        scores : ndarray of shape (n_samples, k)
            With ``return_scores``: float32 scores, comparable within a row and across
            rows (-inf where no label was found): with ``neighbours``, the fused score
            ``(1 - a - b) * p + a * share_input + b * share_hidden``, ``(a, b)`` being
            ``neighbour_weight_``, of the network's softmax over its top candidates and
            the neighbours' votes, times each label's ``(1 / p_l) ** tail_exponent_``;
            with ``neighbours=0``, the output layer's logits.
        """
        self._check_fitted()
        k = _plain(k)
        check_int("k", k, 1, self.trainer_.n_labels)
        if exclude is not None:
            return filtered_topk(self, X, k, exclude, bool(exact), bool(return_scores))
        cluster = self._cluster_trainer(X)
        built = getattr(self, "_fused_parts", None)
        remote = built if hasattr(built, "topk_array") else None  # built on a worker
        if cluster is not None and not return_scores and (remote or not self._fusing()):
            rows = collections.feature_blocks(X)
            self._check_shapes(int(rows.shape[1]), None)
            if remote is not None:  # the whole model, on the worker of its fused parts
                top = remote.topk_array(rows, k, bool(exact))
            else:
                top = cluster.topk_array(rows, k, bool(exact))
            if self._multiclass:
                dtype = self.classes_.dtype if exact else object
                return top.map_blocks(partial(_classes_of, self.classes_), dtype=dtype)
            return top
        Xc = self._features(X, reset=False)
        self._check_shapes(Xc.n_cols, None)
        with self._threads():
            if self._fusing():
                top, scores = self._fused_topk(Xc, k, bool(exact))
            else:
                top, scores = self._network_topk(Xc, k, bool(exact))
        if self._multiclass:
            top = _classes_of(self.classes_, top)
        return (top, scores) if return_scores else top

    def _cluster_trainer(self, X) -> DistributedTrainer | None:
        """The model's trainer if ``X`` is a Dask collection to be read where it is, by a
        model on a cluster; else None (a model in this process reads collections here)."""
        trainer = self.trainer_
        if collections.is_dask_collection(X) and not isinstance(trainer, LocalTrainer):
            return trainer
        return None

    def predict(self, X, top_k: int = 1, *, exact: bool = True):
        """The best labels of each row, as scikit-learn's classifiers predict.

        Parameters
        ----------
        X : sparse matrix, array-like or dask array
            The rows, ``(n_samples, n_features)``.
        top_k : int, default=1
            Labels set per row, in [1, n_labels]; 1 for a multi-class model (its
            :meth:`predict_topk` gives the k best classes).
        exact : bool, default=True
            Score every label; False: only those the LSH tables retrieve.

        Returns
        -------
        scipy.sparse.csr_matrix of shape (n_samples, n_labels), or ndarray of shape (n_samples,)
            Multi-label: the indicator matrix with the ``top_k`` best labels of each row
            set (kept sparse: 100K+ labels a row would not fit dense). Multi-class: the
            best class of each row.
        """
        self._check_fitted()
        top_k = _plain(top_k)
        check_int("top_k", top_k, 1, self.trainer_.n_labels)
        if self._multiclass and top_k != 1:
            raise ValueError(
                f"top_k must be 1 for a multi-class model's predict, got {top_k!r}: "
                "predict_topk(X, k) gives the k best classes"
            )
        top = self.predict_topk(X, top_k, exact=exact)
        if self._multiclass:
            return top[:, 0]
        return topk_indicator(top, self.trainer_.n_labels)

    def score(self, X, y, sample_weight=None, *, k: int = 1, exact: bool = True) -> float:
        """Precision at k (P@k) on ``(X, y)``: scikit-learn's ``score``, greater is better.

        Parameters
        ----------
        X : sparse matrix, array-like or dask array
            The rows, ``(n_samples, n_features)``.
        y : array-like, sparse matrix, list of arrays or dask array
            Their true labels (as :meth:`fit` takes them).
        sample_weight : None
            Not supported (P@k weighs every row alike): must be None.
        k : int, default=1
            The predictions scored per row.
        exact : bool, default=True
            Score every label; False: only those the LSH tables retrieve.

        Returns
        -------
        float
            P@k (multi-class, k=1: the accuracy).
        """
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported: P@k weighs every row alike")
        k = _plain(k)
        return self.evaluate(X, y, ks=(k,), exact=exact)[f"P@{k}"]

    def evaluate(self, X, Y, ks=(1, 3, 5), exact: bool = True, *, exclude=None) -> dict[str, float]:
        """The extreme classification metrics of the predictions for ``X``.

        Parameters
        ----------
        X : sparse matrix, array-like or dask array
            The rows, ``(n_samples, n_features)``.
        Y : array-like, sparse matrix, list of arrays or dask array
            Their true labels (as :meth:`fit` takes them).
        ks : tuple of int, default=(1, 3, 5)
            The cut-offs k.
        exact : bool, default=True
            Score every label; False: only those the LSH tables retrieve.
        exclude : like ``Y``, LabelPairs or None, default=None
            Labels left out of each row's answers before they are scored (the XC
            Repository's ``filter_labels_test.txt``, read by
            :func:`~dslide_dask.data.label_pairs.read_label_pairs` or ``read_pairs``),
            one row a row of ``Y``.

        Returns
        -------
        dict of str to float
            ``P@k`` and ``nDCG@k`` for each k, and ``PSP@k`` and ``PSnDCG@k``
            (propensity-scored, normalised by the best achievable; propensities from the
            labels trained on).
        """
        self._check_fitted()
        ks = tuple(_plain(k) for k in ks)
        if exclude is not None:
            return filtered_metrics(self, X, Y, exclude, ks, bool(exact))
        cluster = self._cluster_trainer(X)
        built = getattr(self, "_fused_parts", None)
        remote = built if hasattr(built, "block_metrics") else None  # built on a worker
        if cluster is not None and not self._multiclass and (remote or not self._fusing()):
            data = self._collection_data(X, Y, cluster.client)
            self._check_shapes(data.n_features, data.n_labels)
            if remote is not None:  # the whole model, on the worker of its fused parts
                return remote.block_metrics(data, ks, bool(exact))
            return cluster.evaluate(data, ks, bool(exact))
        data = self._held_out((X, Y), self.trainer_.n_labels)
        self._check_shapes(data.n_features, data.n_labels)
        with self._threads():
            if self._fusing():
                return self._fused_metrics(data, ks, bool(exact))
            if exact and self._serving_index() is not None:
                return self._index_metrics(data, ks)
            return self.trainer_.evaluate(data, ks, bool(exact))

    def _fusing(self) -> bool:
        """Whether predictions mix in the neighbours' votes."""
        fused = getattr(self, "neighbours_", None), getattr(self, "_fused_parts", None)
        return fused != (None, None)

    def close(self) -> None:
        """Release the fitted model (on a cluster: its actors, the fused parts a worker
        built, and their memory)."""
        built = self.__dict__.pop("_fused_parts", None)
        if built is not None:
            built.close()
        if "trainer_" in self.__dict__:
            self.trainer_.close()

"""``SlideClassifier``: the engine as a scikit-learn estimator.

Extreme multi-label output has hundreds of thousands of labels, so two conventions of
scikit-learn are kept in a form that scales: ``predict`` returns the multi-label
indicator matrix sparse (scipy CSR, the top ``top_k`` labels of each row), and the
scores of the best labels come from :meth:`SlideClassifier.predict_topk`, not from a dense
``decision_function``. A 1-D ``y`` (one class per row) is multi-class classification, with
``classes_`` and 1-D predictions as for any scikit-learn classifier.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import numba
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import type_of_target

from dslide_dask.checkpoint import CheckpointPolicy, open_checkpoint
from dslide_dask.checkpoint.model import config_of
from dslide_dask.data.batches import Source, plan
from dslide_dask.data.csr import CSR, as_csr
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.inputs import labelled_data
from dslide_dask.estimator import _sklearn, collections
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.model.config import SlideConfig, check_float, check_int

#: Called after every step with its statistics (step, samples, loss, active, seconds...).
StepCallback = Callable[[dict], None]
#: Parameters that say how to train and where, not what the network is.
ENGINE_PARAMS = (
    "batch_size",
    "epochs",
    "early_stopping",
    "validation_fraction",
    "n_iter_no_change",
    "tol",
    "n_threads",
    "random_state",
    "n_shards",
    "wire_dtype",
    "pipeline",
    "checkpoint_url",
    "checkpoint_every",
)
#: The training recipe's defaults live in SlideConfig; the estimator reads them there.
_D = SlideConfig()
_MAX_SEED = (1 << 63) - 1

#: scikit-learn checks that cannot apply to extreme multi-label classification, with why.
#: Passed to ``parametrize_with_checks(expected_failed_checks=...)`` (1.6+) and given as
#: the ``_xfail_checks`` tag on 1.5.
EXPECTED_FAILED_CHECKS = {
    "check_classifiers_multilabel_output_format_predict": (
        "multi-label predict returns a scipy sparse indicator matrix: a dense one of 100K+ "
        "labels per row would not fit in memory"
    ),
    "check_classifiers_multilabel_representation_invariance": (
        "compares multi-label predictions as dense arrays; predict returns them sparse"
    ),
}


def p_at_k_scorer(k: int = 1, exact: bool = True) -> Callable:
    """A scorer for ``GridSearchCV``/``cross_val_score``: P@k of the estimator's top k
    (greater is better), as ``scoring=p_at_k_scorer(3)``."""
    check_int("k", k, 1, 1 << 20)

    def scorer(estimator, X, y) -> float:
        return estimator.score(X, y, k=k, exact=exact)

    scorer.__name__ = f"p_at_{k}"
    return scorer


class SlideClassifier(ClassifierMixin, BaseEstimator):
    """Extreme multi-label classifier trained with SLIDE (LSH-sampled sparse softmax).

    Parameters are those of :class:`~dslide_dask.model.SlideConfig` (their defaults are
    its defaults) plus ``batch_size``, ``epochs`` and ``n_threads`` (numba threads in this
    process; default: all cores). ``random_state`` (None, an int or a
    ``numpy.random.RandomState``) seeds the weights, the hash functions and the data
    order; ``seed=`` is accepted as its alias (the CLI's and a saved model's name).

    On Dask, as dask-ml does, the current client (``distributed.default_client()``) is
    used when there is one: the output layer is then sharded over the cluster's workers
    (``n_shards``: default one per worker); activations cross the network as
    ``wire_dtype``, and ``pipeline`` overlaps the end of a step with the start of the
    next. ``client=`` overrides it (``client=False``: train in this process even with a
    current client); it is not a parameter, so it is neither cloned nor pickled.
    ``checkpoint_url`` (any fsspec URL) with ``checkpoint_every`` steps checkpoints the
    model during ``fit``; on a cluster a lost worker is then survived.

    ``X`` is a sparse matrix (scipy, ``sparse.GCXS``/``COO``, :class:`CSR`), a numpy array,
    a Dask array of such chunks, or a URL of training data. ``Y`` is a label indicator
    matrix (dense, sparse or Dask) or a list of label-id arrays (multi-label), or a 1-D
    array of classes (multi-class). A Dask bag of ``(x, labels)`` rows or a dataframe of
    feature and label columns may be ``X`` alone.
    """

    def __init__(
        self,
        hidden: tuple[int, ...] = _D.hidden,
        batch_size: int = 256,
        epochs: int = 1,
        lr: float | None = _D.lr,
        lr_schedule: str = _D.lr_schedule,
        warmup_steps: int = _D.warmup_steps,
        stable_steps: int | None = _D.stable_steps,
        decay_steps: int = _D.decay_steps,
        lr_floor: float = _D.lr_floor,
        beta1: float = _D.beta1,
        beta2: float = _D.beta2,
        eps: float = _D.eps,
        optimizer: str = _D.optimizer,
        hash_family: str = _D.hash_family,
        K: int = _D.K,
        L: int = _D.L,
        range_pow: int | None = _D.range_pow,
        bin_size: int = _D.bin_size,
        simhash_density: float = _D.simhash_density,
        bucket_capacity: int = _D.bucket_capacity,
        bucket_policy: str = _D.bucket_policy,
        strategy: str = _D.strategy,
        threshold: int = _D.threshold,
        min_active: int = _D.min_active,
        max_active: int = _D.max_active,
        pad_correction: bool = _D.pad_correction,
        rebuild_every: int = _D.rebuild_every,
        rebuild_growth: float = _D.rebuild_growth,
        redraw_every: int = _D.redraw_every,
        init_std: float = _D.init_std,
        dropout: float = _D.dropout,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 2,
        tol: float = 0.0,
        n_threads: int | None = None,
        random_state=_D.seed,
        n_shards: int | None = None,
        wire_dtype: str = "float16",
        pipeline: bool = True,
        checkpoint_url: str | None = None,
        checkpoint_every: int = 0,
        *,
        client=None,
        seed=None,
    ) -> None:
        self.hidden = hidden
        self.batch_size = batch_size
        self.epochs = epochs
        self.lr = lr
        self.lr_schedule = lr_schedule
        self.warmup_steps = warmup_steps
        self.stable_steps = stable_steps
        self.decay_steps = decay_steps
        self.lr_floor = lr_floor
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.optimizer = optimizer
        self.hash_family = hash_family
        self.K = K
        self.L = L
        self.range_pow = range_pow
        self.bin_size = bin_size
        self.simhash_density = simhash_density
        self.bucket_capacity = bucket_capacity
        self.bucket_policy = bucket_policy
        self.strategy = strategy
        self.threshold = threshold
        self.min_active = min_active
        self.max_active = max_active
        self.pad_correction = pad_correction
        self.rebuild_every = rebuild_every
        self.rebuild_growth = rebuild_growth
        self.redraw_every = redraw_every
        self.init_std = init_std
        self.dropout = dropout
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.n_threads = n_threads
        # ``seed`` is an alias written into the parameter, so clones and get_params see it
        self.random_state = random_state if seed is None else seed
        self.n_shards = n_shards
        self.wire_dtype = wire_dtype
        self.pipeline = pipeline
        self.checkpoint_url = checkpoint_url
        self.checkpoint_every = checkpoint_every
        self._client = client

    # -- scikit-learn conventions ----------------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The hyperparameters: not ``client`` (a live connection, never cloned or pickled)
        nor the alias ``seed``."""
        return [p for p in super()._get_param_names() if p not in ("client", "seed")]

    def set_params(self, **params) -> SlideClassifier:
        if "seed" in params:
            params["random_state"] = params.pop("seed")
        if "client" in params:
            self.client = params.pop("client")
        return super().set_params(**params)

    @property
    def client(self):
        """The Dask client to train on: the one given, or None (the current client, if any,
        when fitting)."""
        return self._client

    @client.setter
    def client(self, value) -> None:
        self._client = value

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.string = False
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        tags.classifier_tags.multi_label = True
        tags.classifier_tags.poor_score = False
        tags.non_deterministic = False
        return tags

    def _more_tags(self) -> dict:  # scikit-learn 1.5
        return {"multilabel": True, "multioutput": True,
                "_xfail_checks": EXPECTED_FAILED_CHECKS}  # fmt: skip

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None
        trainer = state.get("trainer_")
        if trainer is not None and not isinstance(trainer, LocalTrainer):
            raise TypeError(
                "a SlideClassifier fitted on a Dask cluster cannot be pickled: its model "
                "lives in actors on the workers. save(url) it and SlideClassifier.load(url) "
                "it back (optionally with client=...)"
            )
        return state

    def config(self) -> SlideConfig:
        """The validated network configuration these parameters describe (numpy scalars
        read as the Python numbers they are)."""
        params = {k: _plain(v) for k, v in self.get_params().items() if k not in ENGINE_PARAMS}
        rs = _plain(self.random_state)
        seed = rs if isinstance(rs, int) else 0  # drawn at fit for None or a RandomState
        if not isinstance(rs, int | np.random.RandomState | np.random.Generator | None):
            self._seed()  # the error naming random_state
        return SlideConfig(**params, seed=seed)

    def _seed(self) -> int:
        """The model's seed from ``random_state``: an int as it is; None or a RandomState
        draws one (a new model every fit for None, as scikit-learn's estimators)."""
        rs = _plain(self.random_state)
        if isinstance(rs, int) and not isinstance(rs, bool):
            check_int("random_state", rs, 0, _MAX_SEED)
            return rs
        if rs is None or isinstance(rs, np.random.RandomState):
            return int(check_random_state(rs).randint(np.iinfo(np.int32).max))
        if isinstance(rs, np.random.Generator):
            return int(rs.integers(_MAX_SEED))
        raise ValueError(
            f"random_state must be None, an integer in [0, {_MAX_SEED}] or a "
            f"numpy.random.RandomState, got {self.random_state!r}"
        )

    def _int(self, name: str, low: int, high: int) -> int:
        value = _plain(getattr(self, name))
        check_int(name, value, low, high)
        return value

    def _float(self, name: str, low: float, high: float, **open_ends) -> float:
        value = _plain(getattr(self, name))
        check_float(name, value, low, high, **open_ends)
        return value

    # -- input -----------------------------------------------------------------------------
    def _training_data(self, X, Y, storage_options, classes=None) -> Source:
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
        if Y is None:
            if _is_rows(X):
                Xc, Yc = _rows(X, None, None)
                self._multiclass = False
                self.classes_ = np.arange(Yc.n_cols)
                self.n_features_in_ = Xc.n_cols
                return labelled_data(Xc, Yc)
            raise ValueError(
                "SlideClassifier requires y to be passed, but the target y is None (Y may be "
                "None only for a URL, a dask bag of (x, labels) rows or a dask dataframe)"
            )
        Xc = self._features(X, reset=True)
        Y = self._labels_for_fit(Y, classes)
        return labelled_data(Xc, Y, len(self.classes_))

    def _features(self, X, *, reset: bool) -> CSR:
        """``X`` as CSR: numpy, scipy and array-likes through scikit-learn's own checks
        (``n_features_in_``); sparse arrays, CSR and Dask arrays converted as they are."""
        if isinstance(X, str):
            raise ValueError("X is a URL: only fit and evaluate read data from storage")
        if collections.is_dask_collection(X):
            Xc = collections.csr_of_array(X, "X")
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
                Y = collections.csr_of_array(Y, "Y", pattern=True)
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

    def _labels(self, Y):
        """Labels to score against the fitted model: class labels mapped to their ids."""
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
            return collections.csr_of_array(Y, "Y", pattern=True, n_cols=len(self.classes_))
        if not _is_sparse(Y) and hasattr(Y, "__array__"):
            return np.asarray(Y)
        return Y

    # -- training --------------------------------------------------------------------------
    def fit(
        self,
        X,
        Y=None,
        callback: StepCallback | None = None,
        storage_options: dict | None = None,
        eval_set: tuple | None = None,
        eval_every: int | None = None,
    ) -> SlideClassifier:
        """Train from scratch for ``epochs`` passes, shuffling the rows each epoch.

        ``X`` may be a URL of training data (file, glob, folder, converted layout; ``Y``
        None): it is then streamed from storage by this process or, on a cluster, by the
        coordinator's worker, never through the client.

        ``eval_set=(X_test, Y_test)`` records P@1/3/5 in :attr:`evals_` every
        ``eval_every`` steps (default: after each epoch's worth of steps) and at the end.

        With ``early_stopping``, ``validation_fraction`` of the rows (of a URL: the
        ``eval_set``) are held out and scored (P@1) after each epoch; training stops once
        ``n_iter_no_change`` epochs in a row gained no more than ``tol``, and the weights
        of the best epoch are put back (:attr:`validation_scores_`,
        :attr:`best_validation_score_`, :attr:`n_iter_`).
        """
        epochs = self._int("epochs", 1, 1 << 20)
        batch_size = self._int("batch_size", 1, 1 << 20)
        self.config()  # every parameter checked before the data is read
        data = self._training_data(X, Y, storage_options)
        seed = self._seed()
        validation = None
        if _plain(self.early_stopping):
            data, validation = self._validation_split(data, eval_set, seed)
        self._start(data, seed, -(-data.n_points // batch_size) * epochs, epochs)
        if validation is None:
            self._train(data, epochs, True, callback, eval_set, eval_every)
        else:
            self._train_early_stopping(data, validation, callback, eval_set, eval_every)
        return self

    def _validation_split(self, data: Source, eval_set, seed: int) -> tuple[Source, XCDataset]:
        """``(training rows, validation rows)`` for early stopping."""
        self._int("n_iter_no_change", 1, 1 << 20)
        self._float("tol", 0.0, 1.0)
        if not isinstance(data, XCDataset):
            if eval_set is None:
                raise ValueError(
                    "early_stopping with training data from a URL needs eval_set=(X, Y) "
                    "to validate on: its rows cannot be split off while streaming"
                )
            return data, self._held_out(eval_set, data.n_labels)
        fraction = self._float("validation_fraction", 0.0, 1.0, low_open=True, high_open=True)
        n_valid = round(data.n_points * fraction)
        if not 1 <= n_valid < data.n_points:
            raise ValueError(
                f"validation_fraction={fraction} of {data.n_points} rows "
                f"leaves {n_valid} to validate on and {data.n_points - n_valid} to train on; "
                "both must be at least 1"
            )
        order = np.random.default_rng([seed, 0x5EED]).permutation(data.n_points)
        return data.take(np.sort(order[n_valid:])), data.take(np.sort(order[:n_valid]))

    def _held_out(self, eval_set, n_labels: int) -> XCDataset:
        X, Y = eval_set
        return labelled_data(self._features(X, reset=False), self._labels(Y), n_labels)

    def _train_early_stopping(
        self, data: Source, validation: XCDataset, callback, eval_set, eval_every
    ) -> None:
        """Epoch by epoch, keeping the weights of the best validation P@1."""
        self.validation_scores_: list[float] = []
        self.best_validation_score_ = -np.inf
        stale = 0
        tol, patience = _plain(self.tol), _plain(self.n_iter_no_change)
        for _ in range(_plain(self.epochs)):
            self._train(data, 1, True, callback, eval_set, eval_every)
            score = self.trainer_.evaluate(validation, ks=(1,))["P@1"]
            self.validation_scores_.append(score)
            if score > self.best_validation_score_ + tol:
                self.best_validation_score_ = score
                self.trainer_.remember()
                stale = 0
            else:
                stale += 1
                if stale >= patience:
                    break
        self.n_iter_ = len(self.validation_scores_)
        if np.argmax(self.validation_scores_) != self.n_iter_ - 1:
            self.trainer_.recall()

    def partial_fit(
        self, X, Y=None, classes=None, callback: StepCallback | None = None,
        storage_options: dict | None = None,
    ) -> SlideClassifier:  # fmt: skip
        """One pass over the rows in the given order (a URL: one shuffled pass); starts a
        model on the first call (multi-class: of ``classes``, as scikit-learn's
        ``partial_fit``, default the classes of that first ``y``)."""
        if "trainer_" not in self.__dict__:
            data = self._training_data(X, Y, storage_options, classes)
            self._start(data, self._seed())
        elif isinstance(X, str):
            data = plan(X, storage_options)
            self._check_shapes(data.n_features, data.n_labels)
        else:
            data = self._held_out((X, Y), self.trainer_.n_labels)
        self._train(data, 1, False, callback)
        return self

    def _start(self, data: Source, seed: int, steps: int = 0, epochs: int = 1) -> None:
        """A fresh model for ``data``; a fit of ``steps`` steps in ``epochs`` epochs sets
        the lr schedule (0: unknown, as for ``partial_fit``)."""
        if "trainer_" in self.__dict__:
            self.trainer_.close()
        cfg = replace(self.config(), seed=seed).for_data(data.n_labels, steps, steps // epochs)
        policy = None
        if self.checkpoint_url is not None:
            every = self._int("checkpoint_every", 1, 1 << 40)
            policy = CheckpointPolicy(self.checkpoint_url, every)
        client = self._current_client()
        if client is None:
            self.trainer_ = LocalTrainer(cfg, data.n_features, data.n_labels, checkpoint=policy)
        else:
            from dslide_dask.distributed.trainer import DistributedTrainer

            self.trainer_ = DistributedTrainer(
                client, cfg, data.n_features, data.n_labels, _plain(self.n_shards),
                self.wire_dtype, _plain(self.pipeline), checkpoint=policy,
            )  # fmt: skip
        self.seed_ = seed
        self.epochs_done_ = 0
        self.evals_: list[dict] = []

    def _current_client(self):
        """The client given, else the current one as dask-ml finds it; None: this process.

        ``distributed`` is looked up only if it was imported: without it there can be no
        client, and training in one process then never pays for importing it.
        """
        if self._client is not None:
            return self._client or None  # False: in this process
        if "distributed" not in sys.modules:
            return None
        from distributed import default_client

        try:
            return default_client()
        except ValueError:  # no current client
            return None

    def _train(
        self, data: Source, epochs: int, shuffle: bool, callback, eval_set=None, eval_every=None
    ) -> None:
        batch_size = self._int("batch_size", 1, 1 << 20)
        if eval_set is not None:
            held_out = self._held_out(eval_set, self.trainer_.n_labels)
            self._check_shapes(held_out.n_features, held_out.n_labels)
            every = _plain(eval_every) or max(1, -(-data.n_points // batch_size))
            check_int("eval_every", every, 1, 1 << 40)
            callback = self._evaluating(callback, held_out, every)
        with self._threads():
            self.trainer_.train(
                data, batch_size, epochs, self.seed_, shuffle, callback, self.epochs_done_
            )
            self.epochs_done_ += epochs
            if eval_set is not None and (not self.evals_ or self.evals_[-1]["step"] != self._step):
                self._record_eval(held_out)

    def _evaluating(self, callback, held_out: XCDataset, every: int) -> StepCallback:
        """``callback``, then P@k on ``held_out`` every ``every`` steps."""

        def step(stats: dict) -> None:
            if callback is not None:
                callback(stats)
            if stats["step"] % every == 0:
                self._record_eval(held_out)

        return step

    def _record_eval(self, held_out: XCDataset) -> None:
        scores = self.trainer_.evaluate(held_out)  # on a cluster: also on the dashboard
        self.evals_.append({"step": self._step, "epoch": self.epochs_done_, **scores})

    @property
    def _step(self) -> int:
        return self.trainer_.step

    @property
    def history_(self) -> list[dict]:
        """Per-step statistics of every step taken so far."""
        self._check_fitted()
        return self.trainer_.history

    @property
    def n_steps_(self) -> int:
        """Steps the model has taken (including those before it was saved and loaded)."""
        self._check_fitted()
        return self._step

    # -- persistence -----------------------------------------------------------------------
    def save(self, url: str, storage_options: dict | None = None) -> str:
        """Write the fitted model to ``url`` (any fsspec URL): plain arrays and JSON, no
        pickle; on a cluster, every shard writes its own rows from its worker. Returns
        the checkpoint's URL; :meth:`load` reads it back."""
        self._check_fitted()
        params = {k: _plain(v) for k, v in self.get_params().items() if k != "hidden"}
        params["random_state"] = self.seed_  # the seed used, whatever drew it
        extra = {"estimator": {**params, "epochs_done": self.epochs_done_, "evals": self.evals_}}
        if self._multiclass:
            extra["estimator"]["classes"] = self.classes_.tolist()
        return self.trainer_.save(url, storage_options, extra)

    @classmethod
    def load(
        cls, url: str, client=None, storage_options: dict | None = None,
        n_shards: int | None = None,
    ) -> SlideClassifier:  # fmt: skip
        """A fitted classifier from a model written by :meth:`save` (or any checkpoint,
        e.g. a run folder's latest), in this process or on ``client``'s cluster, split
        into ``n_shards`` (default: as saved in-process, one per worker on a cluster)."""
        ckpt = open_checkpoint(url, storage_options)
        saved = dict(ckpt.meta.get("estimator", {}))
        epochs_done, evals = saved.pop("epochs_done", 0), saved.pop("evals", [])
        classes = saved.pop("classes", None)
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
            clf.trainer_ = LocalTrainer(cfg, n_features, n_labels, n_shards or 1, restore=ckpt)
        else:
            from dslide_dask.distributed.trainer import DistributedTrainer

            clf.trainer_ = DistributedTrainer(
                client, cfg, n_features, n_labels, n_shards, clf.wire_dtype,
                clf.pipeline, restore=ckpt.url, storage_options=storage_options,
            )  # fmt: skip
        clf.seed_ = cfg.seed
        clf.epochs_done_, clf.evals_ = epochs_done, list(evals)
        clf.n_features_in_ = n_features
        clf._multiclass = classes is not None
        clf.classes_ = np.asarray(classes) if classes is not None else np.arange(n_labels)
        return clf

    # -- inference -------------------------------------------------------------------------
    def predict_topk(self, X, k: int = 5, *, exact: bool = True, return_scores: bool = False):
        """Top-k labels per row, best first: label ids (multi-class: the classes).
        ``exact=False``: LSH-retrieved labels only; -1 (multi-class: None) where fewer
        than k are found.

        ``return_scores=True`` also returns their scores, ``(labels, scores)``: the output
        layer's logits (float32, -inf where no label was found), comparable within a row
        and across rows; a probability would need the softmax over every label, which top-k
        inference never computes. In-process models only for now.
        """
        self._check_fitted()
        Xc = self._features(X, reset=False)
        self._check_shapes(Xc.n_cols, None)
        k = _plain(k)
        check_int("k", k, 1, self.trainer_.n_labels)
        scores = None
        with self._threads():
            if return_scores:
                top, scores = self._scored_topk(Xc, k, bool(exact))
            else:
                top = self.trainer_.topk(Xc, k, bool(exact))
        if self._multiclass:
            out = self.classes_[np.maximum(top, 0)]
            if (top < 0).any():
                out = out.astype(object)
                out[top < 0] = None
            top = out
        return (top, scores) if return_scores else top

    def _scored_topk(self, X: CSR, k: int, exact: bool, batch: int = 4096):
        """Top-k ids and logits, merged from every shard's (ids, scores) in this process."""
        if not isinstance(self.trainer_, LocalTrainer):
            raise NotImplementedError(
                "return_scores=True is not available for a model on a Dask cluster yet: "
                "load it in-process (SlideClassifier.load(url)) to score"
            )
        net = self.trainer_.network
        ids = np.empty((X.n_rows, k), np.int64)
        scores = np.empty((X.n_rows, k), np.float32)
        for start in range(0, X.n_rows, batch):
            stop = min(start + batch, X.n_rows)
            h, _ = net.hidden.forward(X.slice_rows(start, stop))
            parts = [shard.topk(h, k, exact) for shard in net.shards]
            all_ids = np.concatenate([p[0] for p in parts], axis=1)
            all_scores = np.concatenate([p[1] for p in parts], axis=1)
            order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
            ids[start:stop] = np.take_along_axis(all_ids, order, axis=1)
            scores[start:stop] = np.take_along_axis(all_scores, order, axis=1)
        return ids, scores

    def predict(self, X, top_k: int = 1, *, exact: bool = True):
        """Multi-label (scikit-learn's convention, kept sparse): a scipy CSR indicator
        matrix of shape ``(n_rows, n_labels)`` with the ``top_k`` best labels of each row
        set. Multi-class: the best class of each row (``top_k`` must be 1; see
        :meth:`predict_topk`)."""
        import scipy.sparse

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
        n_labels = self.trainer_.n_labels
        counts = (top >= 0).sum(axis=1)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        # each row's ids sorted (scipy's canonical form), the -1s of exact=False dropped
        ids = np.sort(np.where(top >= 0, top, n_labels), axis=1)
        ids = ids[np.arange(top.shape[1]) < counts[:, None]]
        data = np.ones(len(ids), np.int8)
        return scipy.sparse.csr_matrix((data, ids, indptr), shape=(len(top), n_labels))

    def score(self, X, y, sample_weight=None, *, k: int = 1, exact: bool = True) -> float:
        """Precision at k (P@k) on ``(X, y)`` (multi-class, k=1: the accuracy)."""
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported: P@k weighs every row alike")
        k = _plain(k)
        return self.evaluate(X, y, ks=(k,), exact=exact)[f"P@{k}"]

    def evaluate(self, X, Y, ks=(1, 3, 5), exact: bool = True) -> dict[str, float]:
        """P@k and nDCG@k for each k in ``ks``, and PSP@k and PSnDCG@k (propensity-scored,
        normalised by the best achievable; propensities from the labels trained on)."""
        self._check_fitted()
        ks = tuple(_plain(k) for k in ks)
        data = self._held_out((X, Y), self.trainer_.n_labels)
        self._check_shapes(data.n_features, data.n_labels)
        with self._threads():
            return self.trainer_.evaluate(data, ks, bool(exact))

    def close(self) -> None:
        """Release the fitted model (on a cluster: its actors and their memory)."""
        if "trainer_" in self.__dict__:
            self.trainer_.close()

    # -- helpers ---------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if "trainer_" not in self.__dict__:
            raise NotFittedError(
                "This SlideClassifier instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )

    def __sklearn_is_fitted__(self) -> bool:
        return "trainer_" in self.__dict__

    def _check_shapes(self, n_features: int, n_labels: int | None) -> None:
        net = self.trainer_
        if n_features != net.n_features:
            raise ValueError(
                f"X has {n_features} features, the model was fitted with {net.n_features}"
            )
        if n_labels is not None and n_labels != net.n_labels:
            raise ValueError(f"Y has {n_labels} labels, the model was fitted with {net.n_labels}")

    @contextmanager
    def _threads(self):
        if self.n_threads is None:
            yield
            return
        n = self._int("n_threads", 1, numba.config.NUMBA_NUM_THREADS)
        before = numba.get_num_threads()
        numba.set_num_threads(n)
        try:
            yield
        finally:
            numba.set_num_threads(before)


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


def _is_rows(X) -> bool:
    """A Dask bag or dataframe of rows (labels inside, no ``Y``)."""
    return collections.is_dask_collection(X) and (
        hasattr(X, "npartitions") and not hasattr(X, "chunks")
    )


def _rows(X, n_features, n_labels):
    if hasattr(X, "columns"):
        return collections.rows_of_frame(X, n_features, n_labels)
    return collections.rows_of_bag(X, n_features, n_labels)

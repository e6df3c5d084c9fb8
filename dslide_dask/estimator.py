"""``SlideClassifier``: the scikit-learn style front of the engine.

Over 400 lines: one estimator class, its parameters and the checks of what users pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import contextmanager

import numba
import numpy as np

from dslide_dask.checkpoint import CheckpointPolicy, open_checkpoint
from dslide_dask.checkpoint.model import config_of
from dslide_dask.data.batches import Source, plan
from dslide_dask.data.csr import as_csr
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.inputs import labelled_data
from dslide_dask.data.stream import Stream
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
    "client",
    "n_shards",
    "wire_dtype",
    "pipeline",
    "checkpoint_url",
    "checkpoint_every",
    "run_name",
)


class SlideClassifier:
    """Extreme multi-label classifier trained with SLIDE (LSH-sampled sparse softmax).

    Parameters are those of :class:`~dslide_dask.model.SlideConfig` plus ``batch_size``,
    ``epochs`` and ``n_threads`` (numba threads in this process; default: all cores).
    With a Dask ``client`` the output layer is sharded over the cluster's workers
    (``n_shards``: default one per worker); activations cross the network as
    ``wire_dtype``, and ``pipeline`` overlaps the end of a step with the start of the
    next (the hidden layer then learns from activations one update old).
    ``checkpoint_url`` (any fsspec URL) with ``checkpoint_every`` steps checkpoints the
    model during ``fit``; on a cluster a lost worker is then survived (see
    ``trainer_.recoveries``). ``run_name`` labels the run's live metrics on the
    dashboard and in Prometheus (default: a random ``dslide-...``).

    ``X`` is a sparse matrix (``sparse.GCXS``/``COO``, scipy, or :class:`CSR`), ``Y`` a
    label indicator matrix or a list of label-id arrays.
    """

    def __init__(
        self,
        hidden: tuple[int, ...] = (128,),
        batch_size: int = 256,
        epochs: int = 1,
        lr: float | None = None,
        lr_schedule: str = "cosine",
        warmup_steps: int = 0,
        stable_steps: int | None = None,
        decay_steps: int = 0,
        lr_floor: float = 0.0,
        beta1: float = 0.0,
        beta2: float = 0.999,
        eps: float = 1e-8,
        optimizer: str = "adam",
        hash_family: str = "dwta",
        K: int = 6,
        L: int = 50,
        range_pow: int | None = None,
        bin_size: int = 8,
        simhash_density: float = 1 / 3,
        bucket_capacity: int = 8,
        bucket_policy: str = "fifo",
        strategy: str = "union",
        threshold: int = 2,
        min_active: int = 2500,
        max_active: int = 4096,
        pad_correction: bool = True,
        rebuild_every: int = 50,
        rebuild_growth: float = 0.0,
        redraw_every: int = 1000,
        init_std: float = 0.05,
        dropout: float = 0.3,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 2,
        tol: float = 0.0,
        n_threads: int | None = None,
        seed: int = 0,
        client=None,
        n_shards: int | None = None,
        wire_dtype: str = "float16",
        pipeline: bool = True,
        checkpoint_url: str | None = None,
        checkpoint_every: int = 0,
        run_name: str | None = None,
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
        self.seed = seed
        self.client = client
        self.n_shards = n_shards
        self.wire_dtype = wire_dtype
        self.pipeline = pipeline
        self.checkpoint_url = checkpoint_url
        self.checkpoint_every = checkpoint_every
        self.run_name = run_name

    # -- scikit-learn conventions ----------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params) -> SlideClassifier:
        for name, value in params.items():
            if name not in self._param_names():
                raise ValueError(f"unknown parameter {name!r} for SlideClassifier")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        sig = inspect.signature(self.__init__).parameters
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if v != sig[k].default]
        return f"SlideClassifier({', '.join(changed)})"

    def config(self) -> SlideConfig:
        """The validated network configuration these parameters describe."""
        params = self.get_params()
        return SlideConfig(**{k: v for k, v in params.items() if k not in ENGINE_PARAMS})

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
        None): it is then streamed from storage by this process or, with a ``client``,
        by the coordinator's worker, never through the client.

        ``eval_set=(X_test, Y_test)`` records P@1/3/5 in :attr:`evals_` every
        ``eval_every`` steps (default: after each epoch's worth of steps) and at the end.

        With ``early_stopping``, ``validation_fraction`` of the rows (of a URL: the
        ``eval_set``) are held out and scored (P@1) after each epoch; training stops once
        ``n_iter_no_change`` epochs in a row gained no more than ``tol``, and the weights
        of the best epoch are put back (:attr:`validation_scores_`,
        :attr:`best_validation_score_`, :attr:`n_iter_`).
        """
        data = self._check_xy(X, Y, storage_options)
        check_int("epochs", self.epochs, 1, 1 << 20)
        check_int("batch_size", self.batch_size, 1, 1 << 20)
        validation = None
        if self.early_stopping:
            data, validation = self._validation_split(data, eval_set)
        self._start(data, -(-data.n_points // self.batch_size))
        if validation is None:
            self._train(data, self.epochs, True, callback, eval_set, eval_every)
        else:
            self._train_early_stopping(data, validation, callback, eval_set, eval_every)
        return self

    def _validation_split(self, data: Source, eval_set) -> tuple[Source, XCDataset]:
        """``(training rows, validation rows)`` for early stopping."""
        check_int("n_iter_no_change", self.n_iter_no_change, 1, 1 << 20)
        check_float("tol", self.tol, 0.0, 1.0)
        if not isinstance(data, XCDataset):
            if eval_set is None:
                raise ValueError(
                    "early_stopping with training data from a URL needs eval_set=(X, Y) "
                    "to validate on: its rows cannot be split off while streaming"
                )
            return data, labelled_data(*eval_set, data.n_labels)
        check_float("validation_fraction", self.validation_fraction, 0.0, 1.0, True, True)
        n_valid = round(data.n_points * self.validation_fraction)
        if not 1 <= n_valid < data.n_points:
            raise ValueError(
                f"validation_fraction={self.validation_fraction} of {data.n_points} rows "
                f"leaves {n_valid} to validate on and {data.n_points - n_valid} to train on; "
                "both must be at least 1"
            )
        order = np.random.default_rng([self.seed, 0x5EED]).permutation(data.n_points)
        return data.take(np.sort(order[n_valid:])), data.take(np.sort(order[:n_valid]))

    def _train_early_stopping(
        self, data: Source, validation: XCDataset, callback, eval_set, eval_every
    ) -> None:
        """Epoch by epoch, keeping the weights of the best validation P@1."""
        self.validation_scores_: list[float] = []
        self.best_validation_score_ = -np.inf
        stale = 0
        for _ in range(self.epochs):
            self._train(data, 1, True, callback, eval_set, eval_every)
            score = self.trainer_.evaluate(validation, ks=(1,))["P@1"]
            self.validation_scores_.append(score)
            if score > self.best_validation_score_ + self.tol:
                self.best_validation_score_ = score
                self.trainer_.remember()
                stale = 0
            else:
                stale += 1
                if stale >= self.n_iter_no_change:
                    break
        self.n_iter_ = len(self.validation_scores_)
        if np.argmax(self.validation_scores_) != self.n_iter_ - 1:
            self.trainer_.recall()

    def _check_xy(self, X, Y, storage_options: dict | None = None) -> Source:
        if isinstance(X, str):
            if Y is not None:
                raise ValueError("with a URL as X the labels come from the file: Y must be None")
            return plan(X, storage_options)
        if Y is None:
            raise ValueError("Y (the labels) is required when X is a matrix")
        return labelled_data(X, Y)

    def partial_fit(
        self, X, Y=None, callback: StepCallback | None = None, storage_options: dict | None = None
    ) -> SlideClassifier:
        """One pass over the rows in the given order (a URL: one shuffled pass); starts a
        model on the first call."""
        data = self._check_xy(X, Y, storage_options)
        if hasattr(self, "trainer_"):
            self._check_shapes(data.n_features, data.n_labels)
        else:
            self._start(data)
        self._train(data, 1, False, callback)
        return self

    def _start(self, data: Source, epoch_steps: int = 0) -> None:
        """A fresh model for ``data``; a fit of ``epochs`` epochs of ``epoch_steps`` steps
        sets the lr schedule (0: unknown, as for ``partial_fit``)."""
        if hasattr(self, "trainer_"):
            self.trainer_.close()
        cfg = self.config().for_data(data.n_labels, self.epochs * epoch_steps, epoch_steps)
        policy = None
        if self.checkpoint_url is not None:
            check_int("checkpoint_every", self.checkpoint_every, 1, 1 << 40)
            policy = CheckpointPolicy(self.checkpoint_url, self.checkpoint_every)
        if self.client is None:
            self.trainer_ = LocalTrainer(cfg, data.n_features, data.n_labels, checkpoint=policy)
        else:
            from dslide_dask.distributed import DistributedTrainer  # distributed: on demand

            self.trainer_ = DistributedTrainer(
                self.client, cfg, data.n_features, data.n_labels, n_shards=self.n_shards,
                wire_dtype=self.wire_dtype, pipeline=self.pipeline, checkpoint=policy,
                name=self.run_name,
            )  # fmt: skip
        self.epochs_done_ = 0
        self.evals_: list[dict] = []

    def _train(
        self, data: Source, epochs: int, shuffle: bool, callback, eval_set=None, eval_every=None
    ) -> None:
        check_int("batch_size", self.batch_size, 1, 1 << 20)
        if eval_set is not None:
            held_out = labelled_data(*eval_set, self.trainer_.n_labels)
            self._check_shapes(held_out.n_features, held_out.n_labels)
            every = eval_every or max(1, -(-data.n_points // self.batch_size))
            check_int("eval_every", every, 1, 1 << 40)
            callback = self._evaluating(callback, held_out, every)
        with self._threads():
            stream = Stream(
                self.batch_size, epochs, self.seed, shuffle, first_epoch=self.epochs_done_
            )
            self.trainer_.train(data, stream, callback)
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
        pickle; with a client, every shard writes its own rows from its worker. Returns
        the checkpoint's URL; :meth:`load` reads it back."""
        self._check_fitted()
        params = {k: v for k, v in self.get_params().items() if k not in ("client", "hidden")}
        extra = {"estimator": {**params, "epochs_done": self.epochs_done_, "evals": self.evals_}}
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
        params = {k: v for k, v in saved.items() if k in cls._param_names()}
        # what the user set wins over what a fit derived from it (the schedule's length)
        clf = cls(**{**config_of(ckpt).to_dict(), **params}).set_params(
            hidden=tuple(ckpt.meta["config"]["hidden"]), client=client, n_shards=n_shards
        )
        n_features, n_labels = ckpt.meta["n_features"], ckpt.meta["n_labels"]
        if client is None:
            clf.trainer_ = LocalTrainer(clf.config(), n_features, n_labels, n_shards or 1,
                                        restore=ckpt)  # fmt: skip
        else:
            from dslide_dask.distributed import DistributedTrainer  # distributed: on demand

            clf.trainer_ = DistributedTrainer(
                client, clf.config(), n_features, n_labels, n_shards=n_shards,
                wire_dtype=clf.wire_dtype, pipeline=clf.pipeline, restore=ckpt.url,
                storage_options=storage_options, name=clf.run_name,
            )  # fmt: skip
        clf.epochs_done_, clf.evals_ = epochs_done, list(evals)
        return clf

    # -- inference -------------------------------------------------------------------------
    def predict_topk(self, X, k: int = 5, exact: bool = True) -> np.ndarray:
        """Top-k label ids per row, best first (``exact=False``: LSH-retrieved labels
        only; -1 where fewer than k are found)."""
        self._check_fitted()
        X = as_csr(X)
        self._check_shapes(X.n_cols, None)
        check_int("k", k, 1, self.trainer_.n_labels)
        with self._threads():
            return self.trainer_.topk(X, k, exact)

    def predict(self, X, exact: bool = True) -> np.ndarray:
        """The best label id of each row."""
        return self.predict_topk(X, 1, exact)[:, 0]

    def score(self, X, Y, k: int = 1, exact: bool = True) -> float:
        """Precision at k (P@k) on ``(X, Y)``."""
        return self.evaluate(X, Y, ks=(k,), exact=exact)[f"P@{k}"]

    def evaluate(self, X, Y, ks=(1, 3, 5), exact: bool = True) -> dict[str, float]:
        """P@k and nDCG@k for each k in ``ks``, and PSP@k and PSnDCG@k (propensity-scored,
        normalised by the best achievable; propensities from the labels trained on)."""
        self._check_fitted()
        data = labelled_data(X, Y, self.trainer_.n_labels)
        self._check_shapes(data.n_features, data.n_labels)
        with self._threads():
            return self.trainer_.evaluate(data, tuple(ks), exact)

    def close(self) -> None:
        """Release the fitted model (on a cluster: its actors and their memory)."""
        if hasattr(self, "trainer_"):
            self.trainer_.close()

    # -- helpers ---------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "trainer_"):
            raise RuntimeError("this SlideClassifier is not fitted yet: call fit() first")

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
        check_int("n_threads", self.n_threads, 1, numba.config.NUMBA_NUM_THREADS)
        before = numba.get_num_threads()
        numba.set_num_threads(self.n_threads)
        try:
            yield
        finally:
            numba.set_num_threads(before)

"""How ``SlideClassifier`` trains: ``fit`` (epochs, early stopping, evaluation during
training) and ``partial_fit``, in this process or on the current Dask client's cluster."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Self

import numpy as np

from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.current_client import current_client
from dslide_dask.data.batches import plan
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.stream import Stream
from dslide_dask.errors import NetworkAloneWarning
from dslide_dask.estimator._inputs import _plain
from dslide_dask.estimator._state import EstimatorState
from dslide_dask.fused_parts import row_stats
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.model.config import check_int
from dslide_dask.model.fused_size import NO_FUSED

if TYPE_CHECKING:
    from dslide_dask.data.held import HeldRows
    from dslide_dask.estimator._state import TrainingData

#: Called after every step with its statistics (step, samples, loss, active, seconds...).
StepCallback = Callable[[dict], None]


class TrainingMixin(EstimatorState):
    """Training of :class:`SlideClassifier` (sets ``trainer_``, ``seed_``,
    ``epochs_done_``, ``evals_`` and, with early stopping, the validation scores)."""

    def fit(
        self,
        X,
        Y=None,
        callback: StepCallback | None = None,
        storage_options: dict | None = None,
        eval_set: tuple | None = None,
        eval_every: int | None = None,
    ) -> Self:
        """Train a new model for ``epochs`` passes over the rows, shuffled each epoch.

        In this process, or on the cluster of the client (given, or the current one).
        With ``neighbours``, the rows trained on are indexed for the neighbours' votes
        and, unless ``neighbour_weight`` is given, a few are held out to choose it.
        With ``early_stopping``, ``validation_fraction`` of the rows (of data not in
        this process: the ``eval_set``) are held out and scored (P@1) after each epoch;
        training stops once ``n_iter_no_change`` epochs in a row gained no more than
        ``tol``, and the weights of the best epoch are put back (``validation_scores_``,
        ``best_validation_score_``, ``n_iter_``).

        Parameters
        ----------
        X : sparse matrix, array-like, dask collection or str
            The features, ``(n_samples, n_features)``, in any form the class's Notes
            list; or the URL of training data (a file, glob, folder of part files or
            converted layout, ``Y`` None), then streamed from storage by this process
            or, on a cluster, by the coordinator's worker, never through the client.
        Y : array-like, sparse matrix, list of arrays, dask array or None, default=None
            The labels: a 0/1 indicator matrix ``(n_samples, n_labels)`` or a list of
            label-id arrays (multi-label), or a 1-D array of classes (multi-class).
            None only with a URL, or a Dask bag or dataframe of rows, as ``X``.
        callback : callable or None, default=None
            Called after every step with its statistics (a dict, as an entry of
            ``history_``), e.g. to drive a progress bar.
        storage_options : dict or None, default=None
            fsspec options of a URL ``X`` (credentials, endpoint...).
        eval_set : tuple of (X_test, Y_test) or None, default=None
            Rows to score while training: P@k, nDCG@k, PSP@k and PSnDCG@k for k in 1, 3
            and 5 go to ``evals_`` every ``eval_every`` steps and at the end.
        eval_every : int or None, default=None
            Steps between the scores on ``eval_set``. None: each epoch's worth of
            steps.

        Returns
        -------
        self : SlideClassifier
            The fitted estimator.
        """
        epochs = self._int("epochs", 1, 1 << 20)
        batch_size = self._int("batch_size", 1, 1 << 20)
        self.config()  # every parameter checked before the data is read
        data = self._training_data(X, Y, storage_options)
        seed = self._seed()
        data, self._held = self._neighbour_split(data, seed)
        validation = None
        if _plain(self.early_stopping):
            data, validation = self._validation_split(data, eval_set, seed)
        self._start(data, seed, -(-data.n_points // batch_size) * epochs, epochs)
        with self._threads():
            self._build_neighbours(data)
        if validation is None:
            self._train(data, epochs, True, callback, eval_set, eval_every, self._held_rows)
        else:
            self._train_early_stopping(data, validation, callback, eval_set, eval_every)
        with self._threads():
            if self._finish_neighbours(data) and eval_set is not None:
                self.evals_.pop()  # scored again with the weight and index the model keeps
                self._record_eval(self._held_out(eval_set, self.trainer_.n_labels))
        return self

    def _validation_split(
        self, data: TrainingData, eval_set, seed: int
    ) -> tuple[TrainingData, XCDataset]:
        """``(training rows, validation rows)`` for early stopping."""
        self._int("n_iter_no_change", 1, 1 << 20)
        self._float("tol", 0.0, 1.0)
        if not isinstance(data, XCDataset):
            if eval_set is None:
                raise ValueError(
                    "early_stopping with training data from a URL or Dask collections on a "
                    "cluster needs eval_set=(X, Y) to validate on: their rows are not here "
                    "to split off"
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

    def _train_early_stopping(
        self, data: TrainingData, validation: XCDataset, callback, eval_set, eval_every
    ) -> None:
        """Epoch by epoch, keeping the weights of the best validation P@1."""
        self.validation_scores_: list[float] = []
        self.best_validation_score_ = -np.inf
        stale = 0
        tol, patience = _plain(self.tol), _plain(self.n_iter_no_change)
        for _ in range(_plain(self.epochs)):
            self._train(data, 1, True, callback, eval_set, eval_every, self._held_rows)
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
        self,
        X,
        Y=None,
        classes=None,
        callback: StepCallback | None = None,
        storage_options: dict | None = None,
    ) -> Self:
        """One pass over the rows in the given order (a URL: one shuffled pass).

        The first call starts a model; later calls train it on. The rows are not kept:
        predictions come from the network alone (no neighbours, centroids or trees; after
        :meth:`fit`, those it built stay as they were), which a
        :class:`~dslide_dask.errors.NetworkAloneWarning` says where ``neighbours`` asks
        for them; the learning rates stay constant after the warm-up (no fit length is
        known).

        Parameters
        ----------
        X : sparse matrix, array-like, dask collection or str
            The features ``(n_samples, n_features)``, or the URL of training data (as
            :meth:`fit` takes them).
        Y : array-like, sparse matrix, list of arrays, dask array or None, default=None
            The labels (as :meth:`fit` takes them); None only with a URL, or a Dask bag
            or dataframe of rows.
        classes : array-like or None, default=None
            Multi-class, first call: every class the model will be asked about, as
            scikit-learn's ``partial_fit`` takes them. None: the classes of the first
            ``y``. Later calls ignore it.
        callback : callable or None, default=None
            Called after every step with its statistics (a dict).
        storage_options : dict or None, default=None
            fsspec options of a URL ``X``.

        Returns
        -------
        self : SlideClassifier
            The estimator, trained one pass more.
        """
        if self._neighbour_k() > 0:
            fused = getattr(self, "neighbours_", None) or getattr(self, "_fused_parts", None)
            warnings.warn(
                "partial_fit trains the network alone: "
                + (
                    "the neighbours, label centroids and trees stay as fit built them"
                    if fused is not None
                    else "the neighbours, label centroids and trees need every row (fit "
                    "builds them); its predictions are the network's"
                ),
                NetworkAloneWarning,
                stacklevel=2,
            )
        if "trainer_" not in self.__dict__:
            data = self._training_data(X, Y, storage_options, classes)
            self._start(data, self._seed())
            self.neighbours_, self.neighbour_weight_ = None, None  # rows not kept
            self.tail_exponent_ = None
        elif isinstance(X, str):
            data = plan(X, storage_options)
            self._check_shapes(data.n_features, data.n_labels)
        else:
            data = self._held_out((X, Y), self.trainer_.n_labels)
        self._train(data, 1, False, callback)
        return self

    def _start(self, data: TrainingData, seed: int, steps: int = 0, epochs: int = 1) -> None:
        """A fresh model for ``data``; a fit of ``steps`` steps in ``epochs`` epochs sets
        the lr schedule (0: unknown, as for ``partial_fit``)."""
        if "trainer_" in self.__dict__:
            self.trainer_.close()
        fused = steps > 0 and self._neighbour_k() > 0  # partial_fit's network ranks alone
        self.seed_ = seed  # the recipe's (its bytes below)
        stats = row_stats(self._current_client(), data) if fused else None
        rare = stats is not None and stats.mostly_rare
        cfg = replace(self.config(), seed=seed).for_data(
            data.n_labels, steps, steps // epochs, fused=fused, rare=rare
        )
        policy = None
        if self.checkpoint_url is not None:
            every = self._int("checkpoint_every", 1, 1 << 40)
            policy = CheckpointPolicy(self.checkpoint_url, every)
        client = self._current_client()
        if client is None:
            self.trainer_ = LocalTrainer(cfg, data.n_features, data.n_labels, checkpoint=policy)
        else:
            from dslide_dask.distributed import DistributedTrainer  # distributed: on demand

            width = cfg.hidden[-1]
            self.trainer_ = DistributedTrainer(
                client,
                cfg,
                data.n_features,
                data.n_labels,
                n_shards=_plain(self.n_shards),
                wire_dtype=self.wire_dtype,
                pipeline=_plain(self.pipeline),
                checkpoint=policy,
                step_mode=self.step_mode,
                name=self.run_name,
                fused_bytes=NO_FUSED if stats is None else self._recipe().nbytes(stats, width),
            )
        self.seed_ = seed
        self.epochs_done_ = 0
        self.evals_: list[dict] = []

    def _current_client(self):
        """The client given, else the current one (:func:`current_client`); None: this
        process."""
        if self._client is not None:
            return self._client or None  # False: in this process
        return current_client()

    def _train(
        self,
        data: TrainingData,
        epochs: int,
        shuffle: bool,
        callback,
        eval_set=None,
        eval_every=None,
        held: HeldRows | None = None,
    ) -> None:
        """Train ``epochs`` passes over ``data``, but the rows ``held`` out (streamed fits:
        their fused parts are weighed on them)."""
        batch_size = self._int("batch_size", 1, 1 << 20)
        if eval_set is not None:
            held_out = self._held_out(eval_set, self.trainer_.n_labels)
            self._check_shapes(held_out.n_features, held_out.n_labels)
            every = _plain(eval_every) or max(1, -(-data.n_points // batch_size))
            check_int("eval_every", every, 1, 1 << 40)
            callback = self._evaluating(callback, held_out, every)
        with self._threads():
            stream = Stream(
                batch_size, epochs, self.seed_, shuffle, first_epoch=self.epochs_done_, held=held
            )
            # blocks on the cluster only ever go to a DistributedTrainer (no client: they are
            # stacked here), which passes a planned URL on to its coordinator's plan()
            self.trainer_.train(data, stream, callback)  # type: ignore[arg-type]
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
        if self._fusing():  # what predict_topk answers: the network and the neighbours
            scores = self._fused_metrics(held_out, (1, 3, 5), True)
        else:
            scores = self.trainer_.evaluate(held_out)  # on a cluster: also on the dashboard
        self.evals_.append({"step": self._step, "epoch": self.epochs_done_, **scores})

"""``SlideClassifier``: the engine as a scikit-learn estimator.

Extreme multi-label output has hundreds of thousands of labels, so two conventions of
scikit-learn are kept in a form that scales: ``predict`` returns the multi-label
indicator matrix sparse (scipy CSR, the top ``top_k`` labels of each row), and the
scores of the best labels come from :meth:`SlideClassifier.predict_topk`, not from a dense
``decision_function``. A 1-D ``y`` (one class per row) is multi-class classification, with
``classes_`` and 1-D predictions as for any scikit-learn classifier.

The class is here with its parameters and scikit-learn conventions; its jobs live beside
it: reading input (``_inputs``), training (``_training``), and what a fitted model does
(``_fitted``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numba
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state

from dslide_dask.errors import NotFittedError
from dslide_dask.estimator._fitted import FittedMixin
from dslide_dask.estimator._inputs import InputsMixin, _plain
from dslide_dask.estimator._neighbours import NeighboursMixin
from dslide_dask.estimator._training import TrainingMixin
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.model.config import SlideConfig, check_float, check_int

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
    "step_mode",
    "checkpoint_url",
    "checkpoint_every",
    "run_name",
    "neighbours",
    "neighbour_weight",
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


class SlideClassifier(
    InputsMixin, NeighboursMixin, TrainingMixin, FittedMixin, ClassifierMixin, BaseEstimator
):
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
    next; ``step_mode="graph"`` runs each step as tasks named by phase for the dashboard
    and performance reports (slower; ``"actor"``, the default, is the fast path).
    ``client=`` overrides it (``client=False``: train in this process even with a
    current client); it is not a parameter, so it is neither cloned nor pickled.
    ``checkpoint_url`` (any fsspec URL) with ``checkpoint_every`` steps checkpoints the
    model during ``fit``; on a cluster a lost worker is then survived. ``run_name`` labels
    the run's live metrics on the dashboard and in Prometheus (default: a random
    ``dslide-...``).

    ``neighbours`` (default 30; 0: off) keeps the training rows (fitted in memory) as an
    inverted index; at prediction, the ``neighbours`` rows nearest a query (cosine of
    the inputs) vote for their labels, and the votes are mixed with the network's
    softmax with ``neighbour_weight`` (None: chosen by the fit on 5% of the rows, at
    most 2,000, held out of the network's training; ``neighbour_weight_`` is the one
    used). Rare labels, whose output rows learn little, are where the votes help most.

    ``X`` is a sparse matrix (scipy, ``sparse.GCXS``/``COO``, :class:`CSR`), a numpy array,
    a Dask array of such chunks, or a URL of training data. ``Y`` is a label indicator
    matrix (dense, sparse or Dask) or a list of label-id arrays (multi-label), or a 1-D
    array of classes (multi-class). A Dask bag of ``(x, labels)`` rows or a dataframe of
    feature and label columns may be ``X`` alone.
    """

    def __init__(
        self,
        *,
        hidden: tuple[int, ...] = _D.hidden,
        batch_size: int = 256,
        epochs: int = 1,
        lr: float | None = _D.lr,
        input_lr: float | None = _D.input_lr,
        output_lr: float | None = _D.output_lr,
        lr_schedule: str = _D.lr_schedule,
        warmup_steps: int = _D.warmup_steps,
        stable_steps: int | None = _D.stable_steps,
        decay_steps: int = _D.decay_steps,
        lr_floor: float = _D.lr_floor,
        beta1: float = _D.beta1,
        beta2: float = _D.beta2,
        eps: float = _D.eps,
        optimizer: str = _D.optimizer,
        moment_dtype: str = _D.moment_dtype,
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
        step_mode: str = "actor",
        checkpoint_url: str | None = None,
        checkpoint_every: int = 0,
        run_name: str | None = None,
        neighbours: int = 30,
        neighbour_weight: float | None = None,
        client=None,
        seed=None,
    ) -> None:
        self.hidden = hidden
        self.batch_size = batch_size
        self.epochs = epochs
        self.lr = lr
        self.input_lr = input_lr
        self.output_lr = output_lr
        self.lr_schedule = lr_schedule
        self.warmup_steps = warmup_steps
        self.stable_steps = stable_steps
        self.decay_steps = decay_steps
        self.lr_floor = lr_floor
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.optimizer = optimizer
        self.moment_dtype = moment_dtype
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
        self.step_mode = step_mode
        self.checkpoint_url = checkpoint_url
        self.checkpoint_every = checkpoint_every
        self.run_name = run_name
        self.neighbours = neighbours
        self.neighbour_weight = neighbour_weight
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

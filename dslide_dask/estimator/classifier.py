"""``SlideClassifier``: the engine as a scikit-learn estimator.

Extreme multi-label output has hundreds of thousands of labels, so two conventions of
scikit-learn are kept in a form that scales: ``predict`` returns the multi-label
indicator matrix sparse (scipy CSR, the top ``top_k`` labels of each row), and the
scores of the best labels come from :meth:`SlideClassifier.predict_topk`, not from a dense
``decision_function``. A 1-D ``y`` (one class per row) is multi-class classification, with
``classes_`` and 1-D predictions as for any scikit-learn classifier.

The class is here with its parameters and scikit-learn conventions; its jobs live beside
it: reading input (``_inputs``), training (``_training``), and what a fitted model does
(``_fitted``). The module is over 400 lines for its documentation only: the class
docstring is the API reference of every parameter and fitted attribute (about 300
lines, kept beside the ``__init__`` it documents, as scikit-learn keeps its own); the
code is about 300 lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numba
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state

from dslide_dask.estimator._fitted import FittedMixin
from dslide_dask.estimator._inputs import InputsMixin, _plain
from dslide_dask.estimator._neighbours import NeighboursMixin
from dslide_dask.estimator._serving import ServingMixin
from dslide_dask.estimator._training import TrainingMixin
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.model.config import SlideConfig, check_float, check_int
from dslide_dask.not_fitted import NotFittedError

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
    "neighbour_mix",
    "tail_exponent",
    "label_classifiers",
    "label_centroids",
    "label_tree",
    "n_label_trees",
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
    """A scorer for ``GridSearchCV``/``cross_val_score``: P@k of the estimator's top k.

    Parameters
    ----------
    k : int, default=1
        The predictions scored per row.
    exact : bool, default=True
        Score every label; False: only those the LSH tables retrieve.

    Returns
    -------
    callable
        ``scorer(estimator, X, y)``, the estimator's P@k (greater is better), named
        ``p_at_{k}``: ``GridSearchCV(..., scoring=p_at_k_scorer(3))``.
    """
    check_int("k", k, 1, 1 << 20)

    def scorer(estimator, X, y) -> float:
        return estimator.score(X, y, k=k, exact=exact)

    scorer.__name__ = f"p_at_{k}"
    return scorer


class SlideClassifier(
    InputsMixin,
    NeighboursMixin,
    TrainingMixin,
    FittedMixin,
    ServingMixin,
    ClassifierMixin,
    BaseEstimator,
):
    """Extreme multi-label classifier trained with SLIDE (LSH-sampled sparse softmax).

    A network ``n_features -> hidden -> n_labels`` whose output layer computes, for each
    training example, only its labels, the neurons its hidden vector hashes to in ``L``
    LSH tables and ``min_active`` random negatives: the cost of a step follows the
    active neurons, not the number of labels. Beside the network, the training rows vote
    for their labels at prediction (``neighbours``). It is a scikit-learn estimator
    (``clone``, ``Pipeline``, ``GridSearchCV`` with :func:`p_at_k_scorer`, pickling of
    models trained in this process).

    On Dask, as dask-ml does, the current client (``distributed.default_client()``) is
    used when there is one: the output layer is then sharded over the cluster's workers,
    each shard an actor pinned to its worker, and only activations and gradients cross
    the network. ``client=`` overrides it.

    Every parameter is keyword-only. Those that define the network and its training
    recipe are :class:`~dslide_dask.model.SlideConfig`'s fields, with its defaults and
    its checks (a ``ValueError`` naming the parameter, raised by ``fit``).

    Parameters
    ----------
    hidden : tuple of int, default=(128,)
        Widths of the hidden layers, each in [1, 65536], ReLU after each. The first is
        the sparse input layer (a row of weights per feature, read and updated only for
        the features a row has); the last is the vector every output neuron reads and
        the LSH tables hash.
    batch_size : int, default=256
        Rows per training step, in [1, 2**20].
    epochs : int, default=1
        Passes over the training rows in :meth:`fit` (shuffled each epoch), in
        [1, 2**20]. With the default schedule the first epoch runs at the full learning
        rates and later ones decay them.
    lr : float or None, default=None
        Learning rate of the dense parameters (hidden biases, dense hidden layers) and
        the base of the two wide layers' rates, in (0, 10]. None: chosen by the number
        of labels when the model meets its data, 1e-2, or 2e-2 from 100,000 labels.
    input_lr : float or None, default=None
        Learning rate of the sparse input layer's rows (one a feature, updated only in
        the batches that hold the feature), in (0, 10]. None: 4 x ``lr``, or 8 x ``lr``
        from 100,000 labels.
    output_lr : float or None, default=None
        Learning rate of the output layer's rows, in (0, 10]: far below ``lr``, since a
        label's row takes an Adam step as a sampled negative in most batches and as a
        positive in few, and Adam then moves it up to ``1/sqrt(1 - beta2)`` (~32) times
        ``output_lr`` at once. None: ``lr`` / 8, or ``lr`` / 64 from 100,000 labels.
    lr_schedule : {'cosine', 'linear', 'constant'}, default='cosine'
        How the learning rates move over a fit: ``warmup_steps`` of linear warm-up, then
        ``stable_steps`` at the full rate, then a decay (half cosine or line) that
        reaches ``lr_floor`` times the rate at step ``decay_steps``. A constant rate over
        several epochs made precision peak early and fall; a decay already in the first
        pass learned less. :meth:`partial_fit` (no length known) keeps the rates constant
        after the warm-up.
    warmup_steps : int, default=0
        Steps of linear warm-up at the start of the schedule, in [0, 2**40].
    stable_steps : int or None, default=None
        Steps at the full rate after the warm-up, in [0, 2**40]. None: the fit's first
        epoch (so a one-epoch fit runs at a constant rate).
    decay_steps : int, default=0
        The step at which the decay reaches ``lr_floor``, in [0, 2**40]. 0: the fit's
        last step.
    lr_floor : float, default=0.0
        Where the decay ends, as a fraction of each rate, in [0, 1].
    beta1 : float, default=0.0
        Adam's first-moment decay, in [0, 1). 0: no momentum, and the first moments are
        not kept at all (less memory and traffic): lazy Adam updates an output row only
        when it is active, and momentum carried between its rare activations misleads
        more than it helps.
    beta2 : float, default=0.999
        Adam's second-moment decay, in [0, 1).
    eps : float, default=1e-8
        Adam's epsilon, in (0, 1].
    optimizer : {'adam', 'dense-adam'}, default='adam'
        ``'adam'``: lazy (sparse) Adam, which updates only the rows a step touched (the
        active output neurons, the input features present), each row bias-corrected by
        its own count of updates. ``'dense-adam'``: exact Adam over every row of both
        wide layers at every step, far slower on wide layers (a reference to compare
        with; on a cluster, live moves then copy every row instead of streaming them).
    moment_dtype : {'float32', 'bfloat16'}, default='float32'
        Storage of Adam's moments of the output layer and the sparse input layer (nearly
        every parameter). ``'bfloat16'`` halves it (2 bytes a moment instead of 4;
        arithmetic still float32, stochastic rounding), for models that must fit small
        workers.
    hash_family : {'dwta', 'simhash'}, default='dwta'
        The LSH functions that put output neurons (their weight rows) and hidden vectors
        in buckets. ``'dwta'``, densified winner-take-all: a code is the position of the
        largest value among ``bin_size`` dimensions (``log2(bin_size)`` bits), and a bin
        of zeros (common after ReLU) borrows the next non-empty bin's code. ``'simhash'``:
        a code is the sign of a sparse random projection (1 bit).
    K : int, default=6
        Codes per table, concatenated into a bucket id (folded by a hash when wider than
        ``range_pow`` bits). More codes: narrower buckets, neurons closer to the query,
        fewer of them. At most ``64 // log2(bin_size)`` for DWTA (21 at ``bin_size=8``),
        64 for SimHash.
    L : int, default=50
        Hash tables, in [1, 1024]. An example's candidates are the neurons in its
        bucket of each table: more tables find more neurons, at a cost in hashing time
        and table memory (``L * 2**range_pow * bucket_capacity`` ids of 4 bytes, which
        must stay under 4 GiB).
    range_pow : int or None, default=None
        log2 of the buckets per table, in [1, 30]. None: chosen for the neurons of each
        shard, about 2.5 a bucket (as SLIDE's reference Amazon-670K setup), between 2**4
        and 2**18 buckets, so that ``L`` tables yield a few hundred neurons and random
        padding supplies the rest of ``min_active``.
    bin_size : int, default=8
        DWTA only: dimensions a code is the argmax of, a power of two in
        [2, min(256, hidden[-1])].
    simhash_density : float, default=1/3
        SimHash only: the share of non-zero (+1 or -1) entries of the random
        projections, in (0, 1].
    bucket_capacity : int, default=8
        Neuron ids a bucket holds, in [1, 65536]; ``bucket_policy`` says which stay once
        more are offered.
    bucket_policy : {'fifo', 'reservoir'}, default='fifo'
        When a bucket is full, ``'fifo'`` overwrites its oldest entry (a ring);
        ``'reservoir'`` keeps each offered id with probability ``capacity / offered``
        (a uniform sample of all of them).
    strategy : {'union', 'topk', 'threshold'}, default='union'
        How an example's candidates from its ``L`` buckets become its active neurons
        (after its labels, up to ``max_active``): ``'union'``, every neuron found
        (tables visited from a rotating start); ``'topk'``, the neurons found in the most
        buckets; ``'threshold'``, the neurons found in at least ``threshold`` buckets.
    threshold : int, default=2
        Buckets a neuron must be found in with ``strategy='threshold'``, in [1, L].
    min_active : int or None, default=None
        Random negatives per training example, over the whole layer, in
        [0, max_active] (each shard draws its share). With ``negatives='shared'`` every
        example scores that many beside its labels and the neurons its tables found;
        with ``'example'``, its own random ones fill its active set up to this number.
        More negatives train a better softmax. None: 4096 shared, 2500 for each
        example; in a fit with ``neighbours`` (they and the label tree rank the
        network's candidates) 1000 for each, and 60 where most training labels are of
        rare labels. Prediction computes none.
    max_active : int, default=4096
        At most this many neurons per example, over the whole layer, in [1, 2**24]
        (never fewer than an example's labels).
    negatives : {'auto', 'shared', 'example'}, default='auto'
        Where the random negatives come from: ``'shared'`` by the batch (drawn once,
        scored for every example as one matrix product, each row taking one Adam step a
        batch: a step in about half the time), or drawn for each ``'example'`` (each
        gathers its own rows, which reaches most rows of a wide layer every step: at
        670K labels the network alone learned more so; with the neighbours, as much).
        ``'auto'``: shared below 100,000 labels, for each example from there.
    pad_correction : bool, default=True
        Weigh the random padding in the softmax as the neurons it stands for (the
        sampled-softmax correction: ``log(neurons not found / neurons padded)`` added to
        their logits). False: each padding neuron counts once.
    rebuild_every : int or None, default=None
        Steps between rebuilds of the hash tables from the output rows, in [0, 2**40]:
        the rows move as they train, and the tables go stale. 0: training retrieves no
        neurons (an example scores its labels and random negatives), and the tables are
        built when inference first asks for them. None: 50 below 100,000 labels, 200
        from there (where a rebuild hashes every row and costs most), and 0 in a fit
        with ``neighbours`` whose training labels are mostly of rare labels (where
        ``min_active`` is 60): the label trees and centroids rank those, and the
        tables' hard negatives moved nothing.
    rebuild_growth : float, default=0.0
        Lengthens the intervals between rebuilds: the k-th interval is
        ``rebuild_every * exp(rebuild_growth * k)`` steps (SLIDE's decaying rebuild
        frequency), in [0, 1]. 0: every ``rebuild_every`` steps.
    redraw_every : int, default=1000
        Steps between new draws of the hash functions (the tables are then rebuilt), in
        [0, 2**40]; 0: never.
    init_std : float, default=0.05
        Standard deviation of the normal initial weights, in (0, 10].
    dropout : float, default=0.3
        Share of the last hidden layer's units zeroed in each training example (inverted
        dropout), in [0, 1). The hidden vector is the only input of every output neuron,
        so this is where a one-bottleneck network learns to spread what it knows. It is
        applied inside each output shard after hashing: the active set is found with the
        whole vector, as at prediction.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows (with a URL or Dask collections on a
        cluster: the ``eval_set`` of :meth:`fit`), score P@1 on them after each epoch,
        stop after ``n_iter_no_change`` epochs without a gain over ``tol`` and put back
        the best epoch's weights (as scikit-learn's MLP).
    validation_fraction : float, default=0.1
        Share of the rows held out with ``early_stopping``, in (0, 1).
    n_iter_no_change : int, default=2
        Epochs in a row without a gain over ``tol`` that stop training with
        ``early_stopping``, in [1, 2**20].
    tol : float, default=0.0
        The least validation P@1 gain that counts with ``early_stopping``, in [0, 1].
    n_threads : int or None, default=None
        numba threads of this process while it fits, predicts or scores, in
        [1, numba.config.NUMBA_NUM_THREADS]. None: as numba is set (all cores).
    random_state : int, numpy.random.RandomState, numpy.random.Generator or None, default=0
        Seeds the weights, the hash functions, the dropout masks, the random padding and
        the order of the rows: an int in [0, 2**63 - 1] gives the same model every fit;
        None or a random generator draws a seed at each fit (a new model every time, as
        scikit-learn's estimators do). ``seed_`` is the seed used.
    n_shards : int or None, default=None
        On a cluster, the shards the output layer is split into, one a worker (those
        with the most threads first), each sized by its worker's threads and memory.
        None: one per worker. Ignored in this process.
    wire_dtype : {'float16', 'float32'}, default='float16'
        On a cluster, how hidden activations and their gradients cross the network:
        float16 with a scale per row (about 3 significant digits of each row, half the
        bytes), or float32.
    pipeline : bool, default=True
        On a cluster, overlap the end of a step with the start of the next: the shards
        finish step t and start t+1 while the coordinator's worker does the hidden
        layers' work, so no worker waits on another (the hidden activations of t+1 then
        come from weights one update old).
    step_mode : {'actor', 'graph'}, default='actor'
        On a cluster, ``'actor'`` (the fast path) runs each step as calls between the
        coordinator's and the shards' actors; ``'graph'`` runs it as Dask tasks named by
        phase (``hash``, ``gather``, ``softmax``, ``scatter``), which the dashboard's
        task stream and performance reports show (slower: for profiling).
    checkpoint_url : str or None, default=None
        Checkpoint the model during :meth:`fit` to this fsspec URL (a store that keeps
        the newest three), every ``checkpoint_every`` steps. On a cluster a lost worker
        is then survived: the model is placed on the workers there are, restored from
        the latest checkpoint and trained on from its data position.
    checkpoint_every : int, default=0
        Steps between checkpoints, in [1, 2**40]; required with ``checkpoint_url``.
    run_name : str or None, default=None
        Labels the run's live metrics on the Dask dashboard (``/dslide``) and in
        Prometheus. None: a random ``dslide-...``.
    neighbours : int, default=30
        Keep the training rows (of a fit from data in memory) as an index, and at
        prediction let the labels of the ``neighbours`` rows nearest a query vote beside
        the network's softmax, in [0, 65536]: the rows nearest in the input (cosine),
        and those nearest in the trained network's last hidden layer. Rare labels, whose
        output rows learn little, are where the votes help most. 0: the network
        alone. A fit from a URL or from Dask collections on a cluster, and
        :meth:`partial_fit`, use the network alone.
    neighbour_weight : float, pair of float or None, default=None
        The votes' weights ``(a, b)`` in the fused score ``(1 - a - b) * p +
        a * share_input + b * share_hidden``, each in [0, 1] and summing to at most 1:
        ``p`` is the network's softmax over its top 100 labels, each ``share`` a label's
        share of those neighbours' similarity. A number is ``a`` (``b`` 0). None:
        chosen by the fit on 5% of the rows (at most 2,000), held out of the network's
        training and indexed at the end; (0.2, 0.5) when the fit has fewer than 2,000
        rows. ``neighbour_weight_`` is the pair used.
    neighbour_mix : float, default=0.35
        How the hidden space's neighbours are found, in [0, 1]: the points nearest by
        ``(1 - neighbour_mix) * cos_hidden + neighbour_mix * cos_input``: points close
        in both spaces are likelier to share a query's labels (one model each, 0 ->
        0.35: PSP@5 0.222 -> 0.226 on Debian-26K, 0.292 -> 0.298 on debian-files, P@1
        within 0.002). 0: the hidden space alone (models saved before it).
    tail_exponent : float or None, default=0.0
        With ``neighbours``, each label's fused score is multiplied by ``(1 / p_l) **
        tail_exponent``, in [0, 0.4]: ``p_l`` is the label's propensity (Jain et al.,
        from its training count, the one PSP@k weighs by), so rare labels, which both the
        softmax and the votes under-score, are lifted. The label centroids lift them
        better (with them, 0 against 0.3 raised P@1 on every set measured and kept
        PSP@k; docs/accuracy.md); without them, 0.3 is the value to set. None: chosen by
        the fit with ``neighbour_weight`` on the same held rows. ``tail_exponent_`` is
        the one used.
    label_classifiers : int, default=0
        With ``neighbours``, every label with at least this many training rows (the
        1,024 most frequent at most) gets a linear classifier of its own over the input
        features (an L2-loss SVM), whose scores join the fused score with a weight ``c``
        on top (``neighbour_weight_``'s third weight; chosen with ``neighbour_weight``,
        0.5 when that is given). The label tree does the same for every label: with it,
        100 against 0 took 3-8 s more for P@1 within 0.002 and PSP@5 0.006-0.007 lower on
        both Debian sets (docs/accuracy.md). 0: none.
    label_centroids : float or None, default=0.5
        With ``neighbours``, the weight ``d`` (in [0, 2], on top like ``c``) of the
        cosine of a row with each candidate label's centroid (the normalised sum of the
        label's training rows, PECOS' label features): a label seen a few times is one
        point of its own rather than a few neighbours apart (``dslide bench accuracy``,
        5 epochs, against the tail boost of 0.3 without them: P@1 / PSP@5 0.8814 /
        0.2196 -> 0.8819 / 0.2331 on Debian-26K, 0.7987 / 0.2939 -> 0.7963 / 0.2996 on
        debian-files, 0.2286 / 0.1809 -> 0.2351 / 0.1907 on its labels of at most 20
        rows; docs/accuracy.md). None: chosen with ``neighbour_weight`` on the held rows,
        which over-rate it (their near-twins' centroids). ``neighbour_weight_``'s fourth
        weight. 0: none.
    label_tree : float, default=0.5
        With ``neighbours``, a label tree as omikuji and PECOS build one (labels halved
        by their centroids down to leaves of 100, a linear classifier for each child of
        a node every 6 halvings, trained on that node's rows) re-ranks the fused
        candidates: each score is multiplied by the likelihood of the label's path to
        this power, in [0, 2]. The other sources rank labels by how alike their rows
        are; the tree tells labels apart (offline on saved candidates, P@1 0.2425 ->
        0.2702 on debian-files' labels of at most 20 rows, 0.7883 -> 0.8070 on
        debian-files; docs/accuracy.md). Trained in seconds at the end of the fit, on
        every training row: scores asked during the fit go without it. 0: none.
    n_label_trees : int or None, default=None
        Label trees built from different seeds, in [1, 8]; a candidate's path loss is
        their mean. A single tree's P@1 moves by 0.002-0.005 with its seed; each tree
        adds its build time to the fit and its scoring to a served row. None: 2 where
        labels of at most 3 training rows hold a third of the training labels or more
        (their ranking is the tree's), else 1; ``len(neighbours_.trees)`` says which.
    client : distributed.Client, False or None, default=None
        The Dask client to train on. None: the current client if there is one, else
        this process; False: this process even with a current client. Not a
        hyperparameter: it is neither cloned nor pickled, nor in ``get_params()``.
    seed : int or None, default=None
        An alias of ``random_state`` (the command line's and a saved model's name); when
        given, it is what ``random_state`` is set to.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Multi-class: the classes of ``y`` (or the ``classes`` given to the first
        :meth:`partial_fit`), sorted. Multi-label: the label ids, ``0 .. n_labels - 1``.
    n_features_in_ : int
        Features (columns of ``X``) the model was fitted with.
    trainer_ : LocalTrainer or DistributedTrainer
        The model being trained and asked, in this process or on the cluster
        (:class:`~dslide_dask.local_trainer.LocalTrainer`,
        :class:`~dslide_dask.distributed.DistributedTrainer`).
    seed_ : int
        The seed the model was built with: ``random_state``'s int, or the one drawn.
    epochs_done_ : int
        Passes over the data trained so far (a :meth:`partial_fit` call counts one).
    history_ : list of dict
        Statistics of every step taken so far: ``step``, ``samples``, ``loss``,
        ``active`` (neurons computed per example), ``lr``, ``seconds`` and
        ``skipped_lines``; on a cluster also ``bytes_sent``, ``bytes_received``,
        ``coordinator_seconds`` and ``shard_wait_seconds``; ``checkpoint`` (its URL)
        after a step that wrote one.
    n_steps_ : int
        Steps the model has taken (including those before it was saved and loaded).
    evals_ : list of dict
        With ``eval_set``: the scores on it, ``{'step', 'epoch', 'P@k', 'nDCG@k',
        'PSP@k', 'PSnDCG@k'}`` for k in 1, 3, 5, every ``eval_every`` steps and at the
        end of the fit.
    neighbours_ : NeighbourIndex or None
        The training rows indexed for the neighbours' votes (None: the network alone).
    neighbour_weight_ : tuple of float or None
        The weights ``(a, b)`` of the input's and the hidden layer's neighbours' votes in
        the fused score, then ``c``, the label classifiers', and ``d``, the label
        centroids', if the model has them (None with no index).
    tail_exponent_ : float or None
        The exponent of the labels' inverse propensities the fused scores are multiplied
        by (None with no index).
    output_index_ : OutputIndex or None
        The index over the output layer predictions go through, once
        :meth:`build_index` built it or :meth:`load` read it (None: every label scored).
    validation_scores_ : list of float
        With ``early_stopping``: the validation P@1 after each epoch.
    best_validation_score_ : float
        With ``early_stopping``: the best of ``validation_scores_``, whose weights the
        model kept.
    n_iter_ : int
        With ``early_stopping``: the epochs run.

    See Also
    --------
    dslide_dask.ensemble.SlideEnsemble : Differently seeded models, predictions fused.
    dslide_dask.model.SlideConfig : The network's parameters, validated.
    dslide_dask.estimator.p_at_k_scorer : P@k for scikit-learn's model selection.

    Notes
    -----
    ``X`` is a sparse matrix (scipy, ``sparse.GCXS``/``COO``,
    :class:`~dslide_dask.data.CSR`), a numpy array, a Dask array of such chunks, or (for
    :meth:`fit` and :meth:`partial_fit`) the URL of training data in the Extreme
    Classification format. ``Y`` is a label indicator matrix (dense, sparse or Dask) or a
    list of label-id arrays (multi-label), or a 1-D array of classes (multi-class: then
    ``classes_`` and 1-D predictions, as any scikit-learn classifier). A Dask bag of
    ``(x, labels)`` rows or a dataframe of a feature and a label column may be ``X``
    alone. With a model on a cluster, Dask collections stay there: each block goes from
    the worker that made it to the model's worker, never through the client.

    Extreme multi-label output has hundreds of thousands of labels, so :meth:`predict`
    returns the indicator matrix sparse (scipy CSR), and the scores of the best labels
    come from :meth:`predict_topk`, not from a dense ``decision_function``.

    Examples
    --------
    >>> from dslide_dask import SlideClassifier
    >>> from dslide_dask.data import make_synthetic
    >>> train, test = make_synthetic("tiny")  # 5,000 rows, 1,000 labels
    >>> clf = SlideClassifier(epochs=1, random_state=0).fit(train.X, train.Y)
    >>> clf.predict_topk(test.X, k=3).shape
    (1000, 3)
    >>> clf.score(test.X, test.Y, k=1) > 0.3  # P@1
    True
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
        min_active: int | None = _D.min_active,
        max_active: int = _D.max_active,
        negatives: str = _D.negatives,
        pad_correction: bool = _D.pad_correction,
        rebuild_every: int | None = _D.rebuild_every,
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
        neighbour_weight: float | tuple[float, float] | None = None,
        neighbour_mix: float = 0.35,
        tail_exponent: float | None = 0.0,
        label_classifiers: int = 0,
        label_centroids: float | None = 0.5,
        label_tree: float = 0.5,
        n_label_trees: int | None = None,
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
        self.negatives = negatives
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
        self.neighbour_mix = neighbour_mix
        self.tail_exponent = tail_exponent
        self.label_classifiers = label_classifiers
        self.label_centroids = label_centroids
        self.label_tree = label_tree
        self.n_label_trees = n_label_trees
        self._client = client

    # -- scikit-learn conventions ----------------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The hyperparameters: not ``client`` (a live connection, never cloned or pickled)
        nor the alias ``seed``."""
        return [p for p in super()._get_param_names() if p not in ("client", "seed")]

    def set_params(self, **params) -> SlideClassifier:
        """Set parameters, as scikit-learn's ``set_params``.

        Parameters
        ----------
        **params : dict
            Parameter names and values; ``seed`` sets ``random_state`` (its alias) and
            ``client`` the client to train on.

        Returns
        -------
        self : SlideClassifier
            This estimator.
        """
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
        return {"multilabel": True, "multioutput": True, "_xfail_checks": EXPECTED_FAILED_CHECKS}

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
        """The validated network configuration these parameters describe.

        Returns
        -------
        SlideConfig
            The parameters that define the network and its recipe (numpy scalars read as
            the Python numbers they are), ``seed`` from an int ``random_state`` (else 0:
            the fit draws one).

        Raises
        ------
        ValueError
            Naming the first parameter outside its allowed range.
        """
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
    def _threads(self) -> Iterator[None]:
        if self.n_threads is None:
            yield
            return
        n = self._int("n_threads", 1, numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        before = numba.get_num_threads()
        if n == before:  # as set: setting it twice more costs a served row 3 us
            yield
            return
        numba.set_num_threads(n)
        try:
            yield
        finally:
            numba.set_num_threads(before)

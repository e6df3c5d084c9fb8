"""Hyperparameters of a SLIDE network, validated with errors that name the parameter."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields, replace

HASH_FAMILIES = ("dwta", "simhash")
BUCKET_POLICIES = ("fifo", "reservoir")
STRATEGIES = ("union", "topk", "threshold")
NEGATIVES = ("auto", "shared", "example")
OPTIMIZERS = ("adam", "dense-adam")
MOMENT_DTYPES = ("float32", "bfloat16")
LR_SCHEDULES = ("cosine", "linear", "constant")

#: Most buckets per table (as a power of two) that range_pow=None picks.
AUTO_RANGE_POW_MAX = 18
#: Neurons per bucket that range_pow=None aims at: as SLIDE's reference Amazon-670K
#: setup (2**18 buckets), so L tables yield a few hundred neurons and random padding
#: supplies the rest of min_active (fuller buckets leave no room for random negatives,
#: and the sampled softmax then learns far less).
AUTO_NEURONS_PER_BUCKET = 2.5

#: Below and from this many labels the automatic learning rates differ.
MANY_LABELS = 100_000
#: The learning rate lr=None picks, below and from MANY_LABELS labels.
AUTO_LR, AUTO_LR_MANY = 1e-2, 2e-2
#: negatives="auto": shared by the batch below MANY_LABELS labels, drawn for each example
#: from it; min_active=None: this many random negatives for each.
MIN_ACTIVE_SHARED, MIN_ACTIVE_EXAMPLE = 4096, 2500
#: min_active=None with negatives drawn for each example, for a network whose candidates
#: the neighbours and the label tree rank (a fit with ``neighbours``): they decide the
#: final order, and 2,500 cost a third more time for the same P@1 (docs/recipe.md).
MIN_ACTIVE_FUSED = 1000
#: MIN_ACTIVE_FUSED where most training labels are of rare labels
#: (:func:`~dslide_dask.model.label_tree.mostly_rare`): the trees and the centroids rank
#: those. With no tables in training (REBUILD_EVERY_RARE), 60 against 250 gave
#: debian-files-rare P@1 0.2685 against 0.2661 (mean of three seeds) and amazon-670k at
#: five epochs 0.5584 against 0.5578, both faster; 30 lost (docs/recipe.md).
MIN_ACTIVE_RARE = 60
#: rebuild_every=None: steps between table rebuilds, below and from MANY_LABELS. At 670K
#: labels a rebuild hashes every row (a fifth of a step's time at 50); every 200 steps
#: lost nothing on amazon-670k and debian-files and trained 6-9% faster (docs/recipe.md).
REBUILD_EVERY, REBUILD_EVERY_MANY = 50, 200
#: rebuild_every=None where MIN_ACTIVE_RARE applies: training retrieves no neurons (0).
#: The tables' hard negatives moved nothing there, beside the trees and the centroids
#: (debian-files-rare, amazon-670k: docs/recipe.md), and hashing and rebuilds cost
#: about a seventh of a step.
REBUILD_EVERY_RARE = 0
#: input_lr=None and output_lr=None: these multiples of lr, below and from MANY_LABELS.
INPUT_LR_SCALE, INPUT_LR_SCALE_MANY = 4.0, 8.0
OUTPUT_LR_SCALE, OUTPUT_LR_SCALE_MANY = 1 / 8, 1 / 64

#: Largest hash tables allowed (L * 2**range_pow * bucket_capacity ids, 4 bytes each).
MAX_TABLE_BYTES = 4 << 30


@dataclass(frozen=True)
class SlideConfig:
    """Everything that defines a network and how it trains (besides data sizes).

    Each field is the :class:`~dslide_dask.estimator.SlideClassifier` parameter of the
    same name (``seed``: its ``random_state`` as an int), documented there with its range
    and default; a config is validated as it is made (:meth:`validate`).
    """

    hidden: tuple[int, ...] = (128,)
    #: Learning rate of the dense parameters (hidden biases, dense hidden layers), and
    #: the base of the two wide layers' rates. None: chosen by the number of labels when
    #: the model meets its data (:meth:`for_data`): 1e-2, or 2e-2 from 100K labels.
    lr: float | None = None
    #: Learning rate of the sparse input layer's rows (one a feature, updated only in
    #: batches that hold the feature). None: 4 x lr, or 8 x lr from 100K labels.
    input_lr: float | None = None
    #: Learning rate of the output layer's rows, far below ``lr``: a label's row takes
    #: Adam steps as a sampled negative in most batches and as a positive in few, and
    #: Adam scales each step by the row's own gradient history, so a positive after a
    #: run of tiny negative gradients moves the row up to ``1/sqrt(1 - beta2)`` (~32)
    #: times ``output_lr``. None: lr / 8, or lr / 64 from 100K labels. (docs/benchmarks.md
    #: gives the figures behind both defaults.)
    output_lr: float | None = None
    #: How lr moves over a fit: ``warmup_steps`` of linear warm-up, then ``stable_steps``
    #: at ``lr``, then a decay (half cosine or line) that reaches ``lr * lr_floor`` at step
    #: ``decay_steps``. A constant lr over several epochs made precision peak early and
    #: fall; decaying lets the last epoch be the best one, while a decay already in the
    #: first pass learned less (one pass is where most is learned). ``decay_steps=0`` and
    #: ``stable_steps=None`` mean the fit's length and its first epoch, which the trainer
    #: fills in (:meth:`for_data`): one epoch is then constant. With no length known
    #: (``partial_fit``) lr stays constant after warm-up.
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    stable_steps: int | None = None
    decay_steps: int = 0
    lr_floor: float = 0.0
    #: No momentum by default: lazy (sparse) Adam updates an output row only when it is
    #: active, and momentum carried over between its rare activations misleads more than
    #: it helps. With 0 the first moments are not kept at all.
    beta1: float = 0.0
    beta2: float = 0.999
    eps: float = 1e-8
    optimizer: str = "adam"
    #: Storage of Adam's moments of the output layer and the sparse input layer (nearly
    #: every parameter): "bfloat16" halves it (2 bytes instead of 4 a moment, arithmetic
    #: still float32, stochastic rounding) for models that must fit small workers.
    moment_dtype: str = "float32"
    #: weights ~ N(0, init_std)
    init_std: float = 0.05
    #: Share of the last hidden layer's units zeroed in each training example (inverted
    #: dropout). The hidden vector is the only input of every output neuron, so this is
    #: where a network of one bottleneck layer learns to spread what it knows.
    dropout: float = 0.3
    hash_family: str = "dwta"
    K: int = 6
    L: int = 50
    range_pow: int | None = None  # None: auto, ~2.5 neurons a bucket, at most 2**18 buckets
    bin_size: int = 8
    simhash_density: float = 1 / 3
    bucket_capacity: int = 8
    bucket_policy: str = "fifo"
    strategy: str = "union"
    threshold: int = 2
    #: Random negatives an example scores, over the whole layer (each shard draws its
    #: share): more negatives, a better-trained softmax. None: 4,096 shared, 2,500 drawn
    #: for each example (filling its active set up to that number), 1,000 when neighbours
    #: and a label tree rank the network's candidates, 60 when most training labels are
    #: also of rare labels.
    min_active: int | None = None
    max_active: int = 4096  # per example, over the whole layer
    #: Where the random negatives come from: "shared" by the whole batch (drawn once,
    #: scored as one matrix product: :mod:`.shared_negatives`; a step in half the time),
    #: or drawn for each "example" (which reaches most rows of a wide layer every step:
    #: at 670K labels the network alone learned more so). "auto": shared below 100K
    #: labels, for each example from there.
    negatives: str = "auto"
    pad_correction: bool = True  # weigh random padding as the neurons it stands for
    #: Steps between rebuilds of the hash tables; 0: training retrieves no neurons
    #: (labels and random negatives), the tables are built when inference asks. None:
    #: 50 below 100K labels, 200 from there, 0 in a fused fit on mostly rare labels.
    rebuild_every: int | None = None
    rebuild_growth: float = 0.0
    redraw_every: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", _widths(self.hidden))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first parameter outside its allowed range."""
        if not self.hidden:
            raise ValueError("hidden must list at least one layer width, got ()")
        for width in self.hidden:
            check_int("hidden", width, 1, 1 << 16)
        if self.lr is not None:
            check_float("lr", self.lr, 0.0, 10.0, low_open=True)
        for name in ("input_lr", "output_lr"):
            if getattr(self, name) is not None:
                check_float(name, getattr(self, name), 0.0, 10.0, low_open=True)
        _check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_int("warmup_steps", self.warmup_steps, 0, 1 << 40)
        if self.stable_steps is not None:
            check_int("stable_steps", self.stable_steps, 0, 1 << 40)
        check_int("decay_steps", self.decay_steps, 0, 1 << 40)
        check_float("lr_floor", self.lr_floor, 0.0, 1.0)
        check_float("beta1", self.beta1, 0.0, 1.0, high_open=True)
        check_float("beta2", self.beta2, 0.0, 1.0, high_open=True)
        check_float("eps", self.eps, 0.0, 1.0, low_open=True)
        check_float("init_std", self.init_std, 0.0, 10.0, low_open=True)
        check_float("dropout", self.dropout, 0.0, 1.0, high_open=True)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("moment_dtype", self.moment_dtype, MOMENT_DTYPES)
        _check_choice("hash_family", self.hash_family, HASH_FAMILIES)
        _check_choice("bucket_policy", self.bucket_policy, BUCKET_POLICIES)
        _check_choice("strategy", self.strategy, STRATEGIES)
        _check_choice("negatives", self.negatives, NEGATIVES)
        check_int("L", self.L, 1, 1024)
        if self.range_pow is not None:
            check_int("range_pow", self.range_pow, 1, 30)
        check_int("bucket_capacity", self.bucket_capacity, 1, 1 << 16)
        if self.hash_family == "dwta":
            check_int("bin_size", self.bin_size, 2, min(256, self.hidden[-1]))
            if self.bin_size & (self.bin_size - 1):
                raise ValueError(f"bin_size must be a power of two, got {self.bin_size}")
            check_int("K", self.K, 1, 64 // self.code_bits)
        else:
            check_int("K", self.K, 1, 64)
            check_float("simhash_density", self.simhash_density, 0.0, 1.0, low_open=True)
        table_bytes = 4 * self.L * (1 << self.buckets_pow(1 << 40)) * self.bucket_capacity
        if table_bytes > MAX_TABLE_BYTES:
            raise ValueError(
                f"hash tables would take {table_bytes / 2**30:.1f} GiB "
                f"(L * 2**range_pow * bucket_capacity * 4 bytes); "
                f"reduce L, range_pow or bucket_capacity to stay under "
                f"{MAX_TABLE_BYTES / 2**30:.0f} GiB"
            )
        check_int("threshold", self.threshold, 1, self.L)
        check_int("max_active", self.max_active, 1, 1 << 24)
        if self.min_active is not None:
            check_int("min_active", self.min_active, 0, self.max_active)
        if self.rebuild_every is not None:
            check_int("rebuild_every", self.rebuild_every, 0, 1 << 40)
        check_float("rebuild_growth", self.rebuild_growth, 0.0, 1.0)
        check_int("redraw_every", self.redraw_every, 0, 1 << 40)
        check_int("seed", self.seed, 0, (1 << 63) - 1)

    def for_data(
        self,
        n_labels: int,
        steps: int = 0,
        epoch_steps: int = 0,
        fused: bool = False,
        rare: bool = False,
    ) -> SlideConfig:
        """This config for a model of ``n_labels`` outputs (the learning rates, if left to
        it) and a fit of ``steps`` steps, ``epoch_steps`` an epoch (the schedule's
        ``decay_steps`` and ``stable_steps``, if left to the fit; 0: no fit known);
        ``fused``: the network's candidates will be ranked beside neighbours and a label
        tree (fewer random negatives, if left to it), ``rare``: most of the training
        labels are of labels seen a few times (fewer still, when fused)."""
        cfg = self
        many = n_labels >= MANY_LABELS
        lr = cfg.lr
        if lr is None:
            lr = AUTO_LR_MANY if many else AUTO_LR
            cfg = replace(cfg, lr=lr)
        if cfg.input_lr is None:
            cfg = replace(cfg, input_lr=lr * (INPUT_LR_SCALE_MANY if many else INPUT_LR_SCALE))
        if cfg.output_lr is None:
            scale = OUTPUT_LR_SCALE_MANY if many else OUTPUT_LR_SCALE
            cfg = replace(cfg, output_lr=lr * scale)
        if cfg.negatives == "auto":
            cfg = replace(cfg, negatives="example" if many else "shared")
        shared = cfg.negatives == "shared"
        fewest = fused and rare and not shared  # the trees and centroids rank rare labels
        if cfg.rebuild_every is None:
            every = REBUILD_EVERY_MANY if many else REBUILD_EVERY
            cfg = replace(cfg, rebuild_every=REBUILD_EVERY_RARE if fewest else every)
        if cfg.min_active is None:
            own = MIN_ACTIVE_EXAMPLE
            if fused:
                own = MIN_ACTIVE_RARE if rare else MIN_ACTIVE_FUSED
            cfg = replace(cfg, min_active=MIN_ACTIVE_SHARED if shared else own)
        if steps and cfg.lr_schedule != "constant":
            stable = epoch_steps if cfg.stable_steps is None else cfg.stable_steps
            cfg = replace(cfg, decay_steps=cfg.decay_steps or int(steps), stable_steps=stable)
        return cfg

    def buckets_pow(self, n_items: int) -> int:
        """log2 of the buckets per table for ``n_items`` neurons: ``range_pow`` if set,
        else about ``AUTO_NEURONS_PER_BUCKET`` a bucket, between 2**4 and 2**18 buckets."""
        if self.range_pow is not None:
            return self.range_pow
        per_bucket = max(1.0, n_items / AUTO_NEURONS_PER_BUCKET)
        return min(AUTO_RANGE_POW_MAX, max(4, math.ceil(math.log2(per_bucket))))

    def parameters(self, n_features: int, n_labels: int) -> int:
        """Weights and biases of this network on data of that shape."""
        widths = (n_features, *self.hidden, n_labels)
        return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))

    def allreduce_bytes(self, n_features: int, n_labels: int) -> int:
        """Bytes a data-parallel step all-reduces for this network: 2 x parameters x 4
        (the yardstick for what model parallelism moves instead)."""
        return 2 * 4 * self.parameters(n_features, n_labels)

    @property
    def code_bits(self) -> int:
        """Bits of one hash code: 1 for SimHash, log2(bin_size) for DWTA."""
        return 1 if self.hash_family == "simhash" else int(math.log2(self.bin_size))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["hidden"] = list(self.hidden)
        return out

    @classmethod
    def from_dict(cls, values: dict) -> SlideConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def _widths(value) -> tuple[int, ...]:
    """Layer widths as a tuple of ints; a float or other non-integer is refused, not
    truncated (``hidden=[1.9]`` is a mistake, not a width of 1)."""
    problem = f"hidden must be a width or a list of widths (positive integers), got {value!r}"
    items = (value,) if isinstance(value, numbers.Integral) else value
    if isinstance(items, str | bytes):
        raise ValueError(problem)
    try:
        items = tuple(items)
    except TypeError:
        raise ValueError(problem) from None
    for width in items:
        if isinstance(width, bool) or not isinstance(width, numbers.Integral):
            raise ValueError(problem)
    return tuple(int(width) for width in items)


def check_int(name: str, value, low: int, high: int) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an integer in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def check_float(
    name: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False
) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a finite number in the range
    (``low_open``/``high_open``: that end excluded)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high
        )
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")

"""One shard of a wide softmax layer: its neurons' weights, Adam state and LSH tables.

A :class:`~dslide_dask.model.layout.ShardLayout` says which neurons a shard owns. A
training step is two calls, because the softmax normaliser spans all shards:

1. :meth:`forward` -> per-example partial sums (:class:`SoftmaxPartials`);
2. :func:`combine_partials` over all shards -> log-sum-exp per example;
3. :meth:`backward` -> this shard's share of the gradient w.r.t. the layer input, after
   updating its own weights. Only activations and gradients ever leave a shard.

Its rows in and out (checkpoints, live moves, early stopping): :mod:`.shard_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import active_sets as active_kernels
from dslide_dask.kernels import adam, topk, wide_layer
from dslide_dask.kernels.bfloat16 import STORAGE
from dslide_dask.kernels.tables import mix64
from dslide_dask.model import shared_negatives
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.exact_topk import exact_topk
from dslide_dask.model.init import init_rows
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.lsh_index import LSHIndex, LSHQuery, MIPSIndex, RebuildSchedule
from dslide_dask.model.optimizer import scheduled_lr
from dslide_dask.model.shard_rows import ShardRows
from dslide_dask.model.shared_negatives import SharedBlock

_STRATEGY = {
    "union": active_kernels.UNION,
    "topk": active_kernels.TOPK,
    "threshold": active_kernels.THRESHOLD,
}


@dataclass
class SoftmaxPartials:
    """Per-example pieces of the global softmax, from one shard."""

    row_max: np.ndarray  # max active logit (-inf if none)
    row_sumexp: np.ndarray  # sum exp(logit - row_max) over the active set
    label_part: np.ndarray  # label_weight * sum of label logits
    n_active: np.ndarray  # active neurons per example


@dataclass
class ActiveSets:
    """A batch's active neurons in one shard (what :meth:`WideShard.hash` found)."""

    h: np.ndarray  # the layer's input, float32
    weight: np.ndarray  # 1/|labels| per example
    active: np.ndarray  # local neuron ids, a row per example, labels first
    n_active: np.ndarray  # entries of each row in use
    n_label: np.ndarray  # of which labels
    n_found: np.ndarray  # of which labels or retrieved from the tables (the rest: padding)
    shared: SharedBlock | None = None  # random neurons every example scores


def combine_partials(parts: list[SoftmaxPartials]) -> tuple[np.ndarray, np.ndarray]:
    """Global log-sum-exp per example and the label term, from every shard's partials."""
    row_max = np.max([p.row_max for p in parts], axis=0)
    finite_max = np.where(np.isfinite(row_max), row_max, 0.0).astype(np.float32)
    total = np.zeros_like(finite_max)
    for p in parts:
        with np.errstate(invalid="ignore", over="ignore"):
            total += np.where(p.row_sumexp > 0, p.row_sumexp * np.exp(p.row_max - finite_max), 0)
    lse = finite_max + np.log(np.maximum(total, np.finfo(np.float32).tiny))
    label = np.sum([p.label_part for p in parts], axis=0)
    return lse.astype(np.float32), label.astype(np.float32)


def label_weights(Y: CSR) -> np.ndarray:
    """1/|labels| per example (0 for an example with no labels)."""
    counts = np.diff(Y.indptr).astype(np.float32)
    return np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)


class WideShard(ShardRows):
    """The neurons of shard ``shard_index`` (under ``layout``) of a wide layer
    ``dim_in -> layout.n_neurons``. ``initialize=False`` leaves the weights and tables
    unset, for :meth:`set_state` to fill (a restore)."""

    def __init__(
        self,
        cfg: SlideConfig,
        dim_in: int,
        layout: ShardLayout,
        shard_index: int = 0,
        initialize: bool = True,
    ) -> None:
        if not 0 <= shard_index < layout.n_shards:
            raise ValueError(f"shard_index must be in [0, {layout.n_shards}), got {shard_index}")
        self.cfg = cfg = cfg.for_data(layout.n_neurons)  # negatives and their count
        assert cfg.min_active is not None and cfg.rebuild_every is not None  # for_data chose
        self.min_active: int = cfg.min_active
        self.dim_in = dim_in
        self.layout = layout
        self.n_neurons = layout.n_neurons
        self.shard_index = shard_index
        self.n_local = layout.size(shard_index)
        seed = int(mix64(np.uint64(cfg.seed) * np.uint64(7919) + np.uint64(shard_index)) >> 2)
        self.seed = seed
        self.W = (
            init_rows(cfg.seed, self.global_ids(np.arange(self.n_local)), dim_in, cfg.init_std)
            if initialize
            else np.empty((self.n_local, dim_in), np.float32)
        )
        self.bias = np.zeros(self.n_local, np.float32)
        # np.zeros, not zeros_like: the OS hands out zeroed pages as rows are first touched
        moments = STORAGE[cfg.moment_dtype]
        self.W_m = np.zeros(self.W.shape, moments)
        self.W_v = np.zeros(self.W.shape, moments)
        self.bias_m = np.zeros(self.n_local, np.float32)
        self.bias_v = np.zeros(self.n_local, np.float32)
        self.W_n = np.zeros(self.n_local, np.int32)  # updates of each row (bias correction)
        self.step = 0
        self._index = LSHIndex(dim_in, cfg, seed, self.n_local)
        # Fresh rows are random, and tables of random rows retrieve random neurons, which
        # an active set's padding gives anyway: training builds them at the first rebuild.
        self._unbuilt = initialize
        self.schedule = RebuildSchedule(cfg.rebuild_every, cfg.rebuild_growth, cfg.redraw_every)
        self._scratch = active_kernels.scratch(0, self.n_local)
        self._shared_pos = np.zeros(0, np.int32)  # each row's index among the shared, or -1
        self._pending: tuple | None = None
        self.keep_updates = False  #: backward keeps what its update read (:mod:`.mirror`)
        self.last_update: tuple | None = None
        #: tables serving's LSH top-k probes instead of training's (set for serving only)
        self.serving_index: LSHIndex | MIPSIndex | None = None

    @property
    def retrieves(self) -> bool:
        """Whether training takes the neurons the tables find (rebuild_every 0: never)."""
        return bool(self.cfg.rebuild_every)

    @property
    def index(self) -> LSHIndex:
        """The training hash tables, built from the rows if no rebuild has yet."""
        if self._unbuilt:
            self.rehash()
        return self._index

    def occupancy(self) -> dict[str, float]:
        """The training tables' fill, without building them (empty before a rebuild)."""
        return self._index.occupancy()

    # -- ids ------------------------------------------------------------------------------
    def global_ids(self, local: np.ndarray) -> np.ndarray:
        return self.layout.global_ids(self.shard_index, local)

    def local_labels(self, Y: CSR) -> tuple[np.ndarray, np.ndarray]:
        """This shard's labels of each example, as local ids in CSR form."""
        mine = self.layout.owner(Y.indices) == self.shard_index
        rows = np.repeat(np.arange(Y.n_rows), np.diff(Y.indptr))
        ptr = np.zeros(Y.n_rows + 1, np.int64)
        np.cumsum(np.bincount(rows[mine], minlength=Y.n_rows), out=ptr[1:])
        return ptr, self.layout.to_local(Y.indices[mine]).astype(np.int32)

    # -- active sets ----------------------------------------------------------------------
    def _active(
        self,
        h: np.ndarray,
        label_ptr: np.ndarray,
        label_ids: np.ndarray,
        train: bool,
        shared: SharedBlock | None = None,
    ):
        cfg = self.cfg
        n_chunks = max(1, min(len(h), active_kernels.N_CHUNKS))
        if self._scratch[0].shape[0] < n_chunks:
            self._scratch = active_kernels.scratch(n_chunks, self.n_local)
        counters, marks = self._scratch
        max_labels = int(np.diff(label_ptr).max(initial=0))
        salt = int(mix64(np.uint64(self.seed) + np.uint64(self.step)) >> 33)
        pos, kind = np.zeros(0, np.int32), np.zeros((len(h), 0), np.uint8)
        if shared is not None:
            if len(self._shared_pos) != self.n_local:
                self._shared_pos = np.full(self.n_local, -1, np.int32)
            pos, kind = self._shared_pos, shared.kind
            pos[shared.rows] = np.arange(len(shared.rows), dtype=np.int32)
        pad = self._share(self.min_active) if train and shared is None else 0
        index = self._index if train else self.index  # training reads unbuilt tables as empty
        if self.retrieves or not train:
            buckets = index.buckets(h)
        else:  # no table probed, no vector hashed
            buckets = np.zeros((len(h), 0), np.int32)
        try:
            return active_kernels.active_sets(
                buckets,
                index.ids,
                index.counts,
                label_ptr,
                label_ids,
                self.n_local,
                _STRATEGY[cfg.strategy],
                cfg.threshold,
                pad,
                max(self._share(cfg.max_active), max_labels),
                salt,
                counters[:n_chunks],
                marks[:n_chunks],
                pos,
                kind,
            )
        finally:
            if shared is not None:
                pos[shared.rows] = -1  # left all -1, as the scratch is left zeroed

    def _pad_shift(self, n_active: np.ndarray, n_found: np.ndarray) -> np.ndarray:
        """log(neurons not found / neurons padded): the weight of a random padding
        neuron in the softmax normaliser (0: no correction, or no padding)."""
        n_pad = n_active - n_found
        if not self.cfg.pad_correction:
            return np.zeros(len(n_active), np.float32)
        rest = np.maximum(self.n_local - n_found, 1)
        return np.where(n_pad > 0, np.log(rest / np.maximum(n_pad, 1)), 0).astype(np.float32)

    def adam_arrays(
        self,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What an Adam step of the rows reads and writes, in the kernels' order: weights,
        moments, biases, their moments and the rows' update counts."""
        return (self.W, self.W_m, self.W_v, self.bias, self.bias_m, self.bias_v, self.W_n)

    def _share(self, count: int) -> int:
        """This shard's part of a per-example neuron count of the whole layer."""
        return -(-count * self.n_local // self.n_neurons)

    # -- training ------------------------------------------------------------------------
    def forward(self, h: np.ndarray, Y: CSR) -> SoftmaxPartials:
        """Compute the active logits of a batch; keep them for :meth:`backward`."""
        return self.gather(self.hash(h, Y))

    def hash(self, h: np.ndarray, Y: CSR) -> ActiveSets:
        """The first half of :meth:`forward`: each example's active neurons, from its
        buckets in this shard's tables and its labels here."""
        h = np.ascontiguousarray(h, np.float32)
        weight = label_weights(Y)
        label_ptr, label_ids = self.local_labels(Y)
        shared = None
        if self.cfg.negatives == "shared":
            seed = (self.cfg.seed, 0x5A, self.shard_index, self.step + 1)
            rows = shared_negatives.draw_rows(self.n_local, self._share(self.min_active), seed)
            shared = SharedBlock(rows, np.zeros((len(h), len(rows)), np.uint8))
        active, n_active, n_label, n_found = self._active(h, label_ptr, label_ids, True, shared)
        n_active[weight == 0] = 0  # an example with no label trains nothing
        return ActiveSets(h, weight, active, n_active, n_label, n_found, shared)

    def gather(self, sets: ActiveSets) -> SoftmaxPartials:
        """The second half of :meth:`forward`: the logits of the active neurons' rows,
        kept for :meth:`backward`, and their softmax partials."""
        h, weight, active, n_active = sets.h, sets.weight, sets.active, sets.n_active
        n_label, n_found = sets.n_label, sets.n_found
        keep = self._dropout(h.shape)
        if keep is not None:
            h = h * keep
        groups, (logits, row_max, row_sumexp, label_part) = self._logits(
            h, active, n_active, n_label, weight, n_found, self._pad_shift(n_active, n_found)
        )
        block = sets.shared
        if block is not None:
            # the shared labels and retrievals count as found, the shared random ones as padding
            n_random = (block.kind == active_kernels.SHARED_RANDOM).sum(axis=1)
            seen = n_found + (len(block.rows) - n_random)
            shift = self._pad_shift(seen + n_random, seen)
            shared_negatives.forward(
                block, h, self.W, self.bias, shift, weight, row_max, row_sumexp, label_part
            )
            n_active = n_active + np.where(weight > 0, len(block.rows), 0).astype(np.int32)
        self._pending = (h, keep, n_label, sets.n_active, weight, logits, groups, block)
        return SoftmaxPartials(row_max, row_sumexp, label_part, n_active)

    def _dropout(self, shape: tuple[int, int]) -> np.ndarray | None:
        """Inverted dropout on this batch's input ``h`` (``cfg.dropout``): kept units
        scaled by ``1 / (1 - p)``, the rest 0; None without dropout.

        Applied after hashing: the active set is retrieved with the whole vector, as at
        inference, and the mask never leaves the shard (no extra traffic). The
        mask of the n-th step is drawn from ``(cfg.seed, n)``: every shard, in one process
        or on a cluster, and a restored run draw the same one.
        """
        p = self.cfg.dropout
        if p == 0:
            return None
        rng = np.random.default_rng([self.cfg.seed, 0xD1, self.step + 1])
        return (rng.random(shape, dtype=np.float32) >= p) * np.float32(1 / (1 - p))

    def _logits(self, h, active, n_active, n_label, weight, pad_start, pad_shift):
        """The active entries grouped by neuron, and the logits and per-example softmax
        sums of :func:`~dslide_dask.kernels.wide_layer.forward_grouped`."""
        width = active.shape[1]
        starts = np.arange(len(h), dtype=np.int64) * width
        bands = numba.get_num_threads()  # a band a thread (same groups whatever the count)
        groups = adam.group_rows(starts, starts + n_active, active.ravel(), self.n_local, bands)
        offsets, _, _, touched = groups
        bounds = adam.chunk_bounds(offsets, touched, adam.N_CHUNKS)
        head = (h, self.W, self.bias, n_active, n_label, weight, pad_start, pad_shift, width)
        out = wide_layer.forward_grouped(*head, *groups, bounds)
        return groups, out

    def backward(self, lse: np.ndarray) -> np.ndarray:
        """Update this shard's neurons and return its share of ``d loss / d h``."""
        if self._pending is None:
            raise RuntimeError("backward() called without a preceding forward()")
        h, keep, n_label, n_active, weight, logits, groups, block = self._pending
        self._pending = None
        n_examples = max(1, int((weight > 0).sum()))
        wide_layer.logit_gradients(n_active, n_label, weight, logits, lse, 1.0 / n_examples)
        if block is not None:
            shared_grads = shared_negatives.backward(block, h, lse, weight, 1.0 / n_examples)
        self.step += 1
        cfg = self.cfg
        offsets, entry_pos, entry_vec, touched = groups
        todo = touched
        if cfg.optimizer == "dense-adam":  # every row, the shared ones by their own step
            todo = np.arange(self.n_local)
            if block is not None:
                todo = np.setdiff1d(todo, block.rows)
        grad_h, coefs = np.zeros_like(h), logits.ravel()
        lr, salt = scheduled_lr(cfg, self.step, cfg.output_lr), self.seed + self.step
        adam.adam_grouped(
            offsets,
            entry_pos,
            entry_vec,
            todo,
            coefs,
            h,
            *self.adam_arrays(),
            lr,
            cfg.beta1,
            cfg.beta2,
            cfg.eps,
            grad_h,
            salt,
        )
        if block is not None:
            grad_rows, grad_bias, grad_shared_h = shared_grads
            shared_negatives.adam_step(self, block.rows, grad_rows, grad_bias, lr, salt)
            grad_h += grad_shared_h
            shared = (block.rows, grad_rows, grad_bias)
        else:
            shared = None
        self.last_update = (
            (self.step, groups, coefs, h, lr, salt, shared) if self.keep_updates else None
        )
        if keep is not None:
            grad_h *= keep
        rebuild, redraw = self.schedule.due(self.step)
        self._unbuilt |= not self.retrieves  # the rows moved: inference builds tables afresh
        if redraw:
            self._index.draw(self._index.seed + 1)
        if rebuild:
            self.rehash()
        return grad_h

    # -- inference -----------------------------------------------------------------------
    def serving_tables(self) -> LSHIndex | MIPSIndex:
        """The tables a serving LSH top-k probes: its own if given, else training's."""
        return self.serving_index or self.index

    def topk(
        self, h: np.ndarray, k: int, exact: bool = True, *, query: LSHQuery | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Best k neurons of this shard per example: ``(global ids, scores)``, descending.

        ``exact`` scores every neuron (blocked matrix products); otherwise only the
        neurons the LSH tables retrieve (ids -1 where fewer than k are found): with a
        ``query``, as serving does (tables probed, candidates scored; see
        :class:`~dslide_dask.model.lsh_index.LSHQuery`), else as training samples them.
        """
        h = np.ascontiguousarray(h, np.float32)
        n = len(h)
        if query is not None and not exact:
            local_ids, scores, _ = self.serving_tables().search(h, self.W, self.bias, query)
            return np.where(local_ids >= 0, self.global_ids(local_ids), -1), scores
        if exact:
            local_ids, scores = exact_topk(h, self.W, self.bias, k, numba.get_num_threads())
            return np.where(local_ids >= 0, self.global_ids(local_ids), -1), scores
        empty = np.zeros(n + 1, np.int64), np.zeros(0, np.int32)
        active, n_active, n_label, _ = self._active(h, *empty, train=False)
        zeros = np.zeros(n, np.float32)
        _, (logits, *_) = self._logits(h, active, n_active, n_label, zeros, n_active, zeros)
        local_ids, scores = topk.topk_of_active(logits, active, n_active, k)
        return np.where(local_ids >= 0, self.global_ids(local_ids), -1), scores


def merge_topk_scores(
    parts: list[tuple[np.ndarray, np.ndarray]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Global top-k ``(ids, scores)`` from every shard's ``(ids, scores)``."""
    ids = np.concatenate([p[0] for p in parts], axis=1)
    scores = np.concatenate([p[1] for p in parts], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(scores, order, axis=1)

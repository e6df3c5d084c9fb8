"""Softmax over each example's active neurons of a wide layer.

A wide layer may be split into shards; the softmax normaliser is global, so the forward
pass returns per-example partial sums (max and sum of exponentials) and the logit
gradients take the combined log-sum-exp. The weight update (:mod:`.adam`) then
back-propagates to the layer input as it reads each active row.
"""

import numba
import numpy as np

from dslide_dask.kernels.active_sets import SHARED_LABEL, SHARED_RANDOM
from dslide_dask.kernels.fast_exp import exp32
from dslide_dask.kernels.prefetch import AHEAD, prefetch_row_read

# Dot products may be reassociated (vectorised); inf/nan semantics are kept.
_FAST = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def forward_grouped(
    h: np.ndarray,
    W: np.ndarray,
    bias: np.ndarray,
    n_active: np.ndarray,
    n_label: np.ndarray,
    label_weight: np.ndarray,
    pad_start: np.ndarray,
    pad_shift: np.ndarray,
    width: int,
    offsets: np.ndarray,
    entry_pos: np.ndarray,
    entry_vec: np.ndarray,
    touched: np.ndarray,
    bounds: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Logits ``[B, width]`` of the active neurons and, per example, the partial
    softmax sums, from the active entries grouped by neuron
    (:func:`~dslide_dask.kernels.adam.group_rows` over the ``[B, width]`` active ids;
    ``bounds`` from :func:`~dslide_dask.kernels.adam.chunk_bounds` split ``touched``).

    Entries ``pad_start[b]:`` of example b are random padding: each stands for
    ``exp(pad_shift[b])`` neurons that were not sampled, so ``pad_shift[b]`` is added to
    their logits (the sampled-softmax correction log(1/q) for uniform sampling); the
    returned logits include it. Returns ``(logits, row_max, row_sumexp, label_part)``
    with ``row_sumexp = sum exp(logit - row_max)`` over the active set and
    ``label_part = label_weight * sum of the label logits`` (the cross-entropy's label
    term).

    Grouping by neuron reads each weight row from memory once per batch however many
    examples it is active in: with a wide layer (hidden 1024) the rows no longer fit in
    cache, and a per-example order read them about ten times over.
    """
    B = h.shape[0]
    H = h.shape[1]
    logits = np.zeros((B, width), np.float32)
    for c in numba.prange(bounds.shape[0] - 1):
        for i in range(bounds[c], bounds[c + 1]):
            r = touched[i]
            if i + AHEAD < bounds[c + 1]:
                prefetch_row_read(W, touched[i + AHEAD])
            w = W[r]
            for q in range(offsets[r], offsets[r + 1]):
                b = entry_vec[q]
                hb = h[b]
                acc = bias[r]
                for k in range(H):
                    acc += w[k] * hb[k]
                j = entry_pos[q] - b * width
                if j >= pad_start[b]:
                    acc += pad_shift[b]
                logits[b, j] = acc
    row_max = np.full(B, -np.inf, np.float32)
    row_sumexp = np.zeros(B, np.float32)
    label_part = np.zeros(B, np.float32)
    for b in numba.prange(B):
        mx = np.float32(-np.inf)
        for j in range(n_active[b]):
            mx = max(mx, logits[b, j])
        total = np.float32(0.0)
        for j in range(n_active[b]):
            total += exp32(logits[b, j] - mx)
        lab = np.float32(0.0)
        for j in range(n_label[b]):
            lab += logits[b, j]
        row_max[b] = mx
        row_sumexp[b] = total
        label_part[b] = lab * label_weight[b]
    return logits, row_max, row_sumexp, label_part


@numba.njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def logit_gradients(
    n_active: np.ndarray,
    n_label: np.ndarray,
    label_weight: np.ndarray,
    logits: np.ndarray,
    lse: np.ndarray,
    scale: float,
) -> None:
    """Overwrite ``logits`` with ``d loss / d logit = (softmax - target) * scale``, the
    target putting ``label_weight`` on each label (the first ``n_label`` entries)."""
    scale32 = np.float32(scale)  # a float64 factor would widen every element
    for b in numba.prange(logits.shape[0]):
        row, shift, n_lab, target = logits[b], lse[b], n_label[b], label_weight[b]
        for j in range(n_active[b]):
            g = exp32(row[j] - shift)
            row[j] = (g - (target if j < n_lab else np.float32(0.0))) * scale32


@numba.njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def shared_logits(
    logits: np.ndarray,
    bias: np.ndarray,
    kind: np.ndarray,
    shift: np.ndarray,
    weight: np.ndarray,
    row_max: np.ndarray,
    row_sumexp: np.ndarray,
    label_part: np.ndarray,
) -> None:
    """A batch's shared neurons' logits, in place: ``logits`` ``[B, n]`` holds ``h @
    W[shared].T`` and gains ``bias`` (the shared rows') and, where ``kind`` is
    SHARED_RANDOM, ``shift[b]``; ``-inf`` for examples of weight 0. The softmax
    partials of :func:`forward_grouped` (``row_max``, ``row_sumexp``, ``label_part``)
    take the shared neurons in."""
    B, n = logits.shape
    for b in numba.prange(B):
        row = logits[b]
        if weight[b] == 0:
            row[:] = -np.inf
            continue
        old = row_max[b]
        mx = old
        lab = np.float32(0.0)
        kinds, pad = kind[b], shift[b]
        for j in range(n):
            x = row[j] + bias[j] + (pad if kinds[j] == SHARED_RANDOM else np.float32(0.0))
            lab += x if kinds[j] == SHARED_LABEL else np.float32(0.0)
            row[j] = x
            mx = max(mx, x)
        safe = mx if np.isfinite(mx) else np.float32(0.0)
        total = np.float32(0.0)
        if row_sumexp[b] > 0:
            total = row_sumexp[b] * exp32(old - safe)
        for j in range(n):
            total += exp32(row[j] - safe)
        row_max[b] = mx
        row_sumexp[b] = total
        label_part[b] += lab * weight[b]


@numba.njit(cache=True, nogil=True, parallel=True, fastmath=_FAST)
def shared_gradients(
    logits: np.ndarray,
    lse: np.ndarray,
    kind: np.ndarray,
    weight: np.ndarray,
    scale: float,
) -> None:
    """Turn the shared block's ``logits`` into their gradients in place: ``(softmax -
    target) * scale`` with ``softmax = exp(logit - lse)``, the target putting
    ``weight[b]`` on the example's labels (``kind`` SHARED_LABEL), 0 for examples of
    weight 0."""
    B, n = logits.shape
    scale32 = np.float32(scale)  # a float64 factor would widen every element
    for b in numba.prange(B):
        row = logits[b]
        if weight[b] == 0:
            row[:] = 0
            continue
        shift, kinds, target = lse[b], kind[b], weight[b]
        for j in range(n):
            g = exp32(row[j] - shift)
            row[j] = (g - (target if kinds[j] == SHARED_LABEL else np.float32(0.0))) * scale32

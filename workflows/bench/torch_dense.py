"""Dense full-softmax baseline in PyTorch (CPU): what SLIDE's sampled softmax competes with.

Same network as the engine: sparse input -> ReLU hidden layers -> one output neuron per
label, softmax cross-entropy against ``1/|labels|`` on each true label (the gradient of a
label neuron is ``(1/|labels| - p)/B``, of any other ``-p/B``), Adam over all weights
every step with the engine's betas, weights and biases ~ N(0, init_std) with the engine's
``init_std`` (0.01 by default, as in the SLIDE reference code).

Measured (roughly: a shared, busy 2-core machine) on Amazon-670K sizes, 135,909 -> 128 ->
670,091, batch 256, 2 threads:

- sparse input layer: ``EmbeddingBag(mode="sum", per_sample_weights=...)`` forward +
  backward ~22 ms a batch against ~47 ms for ``torch.sparse_csr_tensor @ W``
  (``input_layer="csr"``); both are noise next to the output layer.
- output layer + loss: a custom autograd function (:func:`build_model`) turns the
  logits into probabilities and then, in place, into the gradient ``(p - t)/B``.
  ``logsumexp - t.z`` through autograd took ~6 s a step, ``log_softmax`` + gather
  ~2.9 s, the fused one ~1.8 s (three GEMMs of 22 GFLOP are ~1.2 s of that).
- Adam ``fused=True``: ~10x faster on CPU than the default per-parameter loop.

Rows without labels add nothing to the loss. Exact top-k for evaluation.
"""

from __future__ import annotations

import functools
import resource
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dslide_dask.data import CSR, XCDataset
from dslide_dask.metrics import precision_at_k

INPUT_LAYERS = ("embedding_bag", "csr")


def _import_torch():
    try:
        import torch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the dense baseline needs PyTorch: pip install 'dslide-dask[bench]'"
        ) from err
    return torch


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB.

    From ``VmHWM`` on Linux: ``ru_maxrss`` survives fork+exec, so a child process would
    report its parent's peak if that was higher (e.g. after generating the data).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024 if sys.platform == "darwin" else 1024)


def build_model(
    torch, n_features: int, hidden: Sequence[int], n_labels: int, mode: str, init_std: float = 0.01
):
    """The dense network; every parameter drawn from ``N(0, init_std)``."""
    nn = torch.nn

    class SoftmaxXent(torch.autograd.Function):
        """Output layer + softmax cross-entropy, fused so the (batch x labels) buffer is
        made once: logits become probabilities in the forward pass and the gradient
        ``(p - t)/B`` in place in the backward pass (autograd's log_softmax + gather
        needs three such buffers and two more exp passes)."""

        @staticmethod
        def forward(ctx, h, weight, bias, rows, cols, weights, has_label):
            p = torch.softmax(torch.addmm(bias, h, weight.t()), dim=1)
            label_p = p[rows, cols].clamp_min(1e-30)
            ctx.save_for_backward(h, weight, p, rows, cols, weights, has_label)
            return -(torch.log(label_p) * weights).sum() / len(h)

        @staticmethod
        def backward(ctx, grad_loss):
            h, weight, p, rows, cols, weights, has_label = ctx.saved_tensors
            p.index_put_((rows, cols), -weights, accumulate=True)
            p.mul_((has_label * (grad_loss / len(h))).unsqueeze(1))  # no labels: no gradient
            return p @ weight, p.t() @ h, p.sum(0), None, None, None, None

    class DenseXC(torch.nn.Module):
        """Sparse input -> ReLU hidden layers -> full output layer."""

        def __init__(self) -> None:
            super().__init__()
            self.mode = mode
            self.embed = nn.EmbeddingBag(n_features, hidden[0], mode="sum")
            self.bias0 = nn.Parameter(torch.empty(hidden[0]))
            sizes = [*hidden, n_labels]
            pairs = zip(sizes[:-1], sizes[1:], strict=True)
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairs)
            for p in self.parameters():
                nn.init.normal_(p, 0.0, init_std)

        def hidden(self, indptr, indices, values):
            """Activations of the last hidden layer."""
            if self.mode == "csr":
                shape = (len(indptr) - 1, self.embed.num_embeddings)
                with warnings.catch_warnings():  # "beta", "invariant checks disabled"
                    warnings.simplefilter("ignore", UserWarning)
                    x = torch.sparse_csr_tensor(indptr, indices, values, shape)
                h = x @ self.embed.weight
            else:
                h = self.embed(indices, indptr[:-1], per_sample_weights=values)
            h = torch.relu(h + self.bias0)
            for layer in self.layers[:-1]:
                h = torch.relu(layer(h))
            return h

        def forward(self, indptr, indices, values):
            """Logits over all labels."""
            return self.layers[-1](self.hidden(indptr, indices, values))

        def loss(self, X: CSR, Y: CSR):
            """Batch mean of ``-sum_j t_j log softmax(z)_j``, ``t_j = 1/|labels|`` on labels."""
            out = self.layers[-1]
            h = self.hidden(*_inputs(torch, X))
            return SoftmaxXent.apply(h, out.weight, out.bias, *_targets(torch, Y))

    return DenseXC()


def _inputs(torch, X: CSR):
    """A CSR batch as (indptr, indices, values) tensors."""
    indptr = torch.from_numpy(X.indptr)
    indices = torch.from_numpy(X.indices.astype(np.int64))
    return indptr, indices, torch.from_numpy(X.values())


def _targets(torch, Y: CSR):
    """Rows, labels and weights ``1/|labels of the row|`` of all true labels; row has-label."""
    counts = np.diff(Y.indptr)
    rows = np.repeat(np.arange(Y.n_rows), counts)
    weights = np.repeat(1.0 / np.maximum(counts, 1), counts).astype(np.float32)
    return (
        torch.from_numpy(rows),
        torch.from_numpy(Y.indices.astype(np.int64)),
        torch.from_numpy(weights),
        torch.from_numpy((counts > 0).astype(np.float32)),
    )


def predict_topk(model, X: CSR, k: int = 5, batch_size: int = 256) -> np.ndarray:
    """Exact top-k over all labels, best first."""
    torch = _import_torch()
    out = []
    with torch.no_grad():
        for start in range(0, X.n_rows, batch_size):
            logits = model(*_inputs(torch, X.slice_rows(start, start + batch_size)))
            out.append(torch.topk(logits, k, dim=1).indices.numpy())
    return np.concatenate(out) if out else np.zeros((0, k), np.int64)


def train_dense(
    train: XCDataset,
    test: XCDataset,
    *,
    hidden: Sequence[int] = (128,),
    batch_size: int = 256,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    init_std: float = 0.01,
    threads: int = 2,
    epochs: int = 1,
    seed: int = 0,
    input_layer: str = "embedding_bag",
    progress: Callable[[int, int], None] | None = None,
    on_epoch: Callable[[int, float, Callable[..., np.ndarray]], None] | None = None,
) -> dict[str, Any]:
    """Train the dense baseline on ``train`` and evaluate P@1/3/5 on ``test``.

    Epoch 0 visits ``train`` in the given order (shuffle it first), later epochs a
    reshuffle. ``train_seconds`` covers model construction and all epochs, not evaluation;
    ``first_batch_seconds`` is construction plus the first batch. ``progress(step,
    samples)`` is called after every batch; ``on_epoch(epoch, train_seconds, topk)``
    after every epoch, with ``topk(X, k=5)`` the top-k labels of rows ``X``; its time is not
    counted as training time.
    """
    torch = _import_torch()
    if input_layer not in INPUT_LAYERS:
        raise ValueError(f"input_layer must be one of {INPUT_LAYERS}, got {input_layer!r}")
    hidden = tuple(int(h) for h in hidden)
    if not hidden:
        raise ValueError("hidden must name at least one layer")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)

    start, cpu_start = time.perf_counter(), time.process_time()
    model = build_model(torch, train.n_features, hidden, train.n_labels, input_layer, init_std)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, fused=True)
    first_batch_seconds = None
    n_batches = samples = 0
    loss_sum = 0.0
    for epoch in range(epochs):
        data = train if epoch == 0 else train.shuffled(seed + epoch)
        for batch in data.batches(batch_size):
            opt.zero_grad(set_to_none=True)
            loss = model.loss(batch.X, batch.Y)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            n_batches += 1
            samples += batch.n_points
            if first_batch_seconds is None:
                first_batch_seconds = time.perf_counter() - start
            if progress is not None:
                progress(n_batches, samples)
        if on_epoch is not None:
            paused, cpu_paused = time.perf_counter(), time.process_time()
            on_epoch(epoch + 1, paused - start, functools.partial(predict_topk, model))
            start += time.perf_counter() - paused  # evaluating is not training
            cpu_start += time.process_time() - cpu_paused
    train_seconds = time.perf_counter() - start
    train_cpu_seconds = time.process_time() - cpu_start

    t_eval = time.perf_counter()
    scores = precision_at_k(predict_topk(model, test.X, 5), test.Y, (1, 3, 5))
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "contender": f"torch-dense ({input_layer})",
        "samples_per_s": samples / train_seconds,
        "train_seconds": train_seconds,
        "train_cpu_seconds": train_cpu_seconds,
        "first_batch_seconds": first_batch_seconds,
        **scores,
        "eval_seconds": time.perf_counter() - t_eval,
        "mean_loss": loss_sum / max(n_batches, 1),
        "n_params": int(n_params),
        "threads": threads,
        "peak_rss_mb": peak_rss_mb(),
    }

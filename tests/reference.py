"""A dense numpy SLIDE network with full softmax: the ground truth the kernels must match
when every output neuron is active."""

from __future__ import annotations

import numpy as np


def softmax_grad(logits: np.ndarray, Y: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-example log-sum-exp and ``d loss / d logits`` (mean over labelled examples)."""
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    target = np.zeros_like(logits)
    for b, labels in enumerate(Y):
        if len(labels):
            target[b, labels] = 1.0 / len(labels)
    n = sum(1 for labels in Y if len(labels))
    grad = (np.exp(logits - lse[:, None]) - target) / n
    grad[[len(labels) == 0 for labels in Y]] = 0
    return lse, grad


class Adam:
    def __init__(self, param: np.ndarray, lr: float, b1=0.9, b2=0.999, eps=1e-8) -> None:
        self.m = np.zeros_like(param, dtype=np.float64)
        self.v = np.zeros_like(param, dtype=np.float64)
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0

    def step(self, param: np.ndarray, grad: np.ndarray) -> np.ndarray:
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad**2
        lr_t = self.lr * np.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
        return param - lr_t * self.m / (np.sqrt(self.v) + self.eps)


class DenseNetwork:
    """sparse input -> ReLU layers -> full softmax; float64, plain numpy."""

    def __init__(
        self,
        weights,
        biases,
        W_out,
        b_out,
        lr: float,
        output_lr: float,
        b1: float = 0.9,
        input_lr: float | None = None,
    ) -> None:
        self.params = [np.array(p, np.float64) for p in [*weights, *biases, W_out, b_out]]
        self.n_hidden = len(weights)
        rates = [lr] * (len(self.params) - 2) + [output_lr] * 2
        if weights:  # the sparse input layer
            rates[0] = lr if input_lr is None else input_lr
        self.opt = [Adam(p, rate, b1) for p, rate in zip(self.params, rates, strict=True)]

    def step(self, X_dense: np.ndarray, Y: list[np.ndarray]) -> np.ndarray:
        """One Adam step; returns ``d loss / d h_last``."""
        n = self.n_hidden
        Ws, bs, W_out, b_out = self.params[:n], self.params[n : 2 * n], *self.params[2 * n :]
        acts = [X_dense]
        for W, b in zip(Ws, bs, strict=True):
            acts.append(np.maximum(acts[-1] @ W + b, 0))
        _, g = softmax_grad(acts[-1] @ W_out.T + b_out, Y)
        grads = [None] * len(self.params)
        grads[-2], grads[-1] = g.T @ acts[-1], g.sum(0)
        grad_h = g @ W_out
        grad = grad_h * (acts[-1] > 0)
        for layer in range(n - 1, -1, -1):
            grads[layer] = acts[layer].T @ grad
            grads[n + layer] = grad.sum(0)
            grad = (grad @ Ws[layer].T) * (acts[layer] > 0)
        self.params = [o.step(p, gr) for o, p, gr in zip(self.opt, self.params, grads, strict=True)]
        return grad_h

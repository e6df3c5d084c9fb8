"""The hidden stack: a sparse input layer, then optional dense layers, all ReLU."""

from __future__ import annotations

import numba
import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import adam, sparse_input
from dslide_dask.kernels.bfloat16 import STORAGE, convert
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.optimizer import adam_lr, arrays_to_read, scheduled_lr, with_row_updates


class HiddenLayers:
    """``n_features -> hidden[0] -> ... -> hidden[-1]``, ReLU after each layer.

    The first weight matrix is feature-major ``[n_features, hidden[0]]``: a sparse row
    reads and updates only the rows of its non-zero features (lazy Adam on those rows).

    ``columns=(c0, c1)``: only units ``c0 .. c1-1`` of a one-layer stack, for a layer
    split by units over workers. Every unit's arithmetic is its own, so the slices
    together compute exactly what the whole layer does, from the same initial weights.
    """

    def __init__(
        self,
        cfg: SlideConfig,
        n_features: int,
        seed: int,
        initialize: bool = True,
        columns: tuple[int, int] | None = None,
    ) -> None:
        """``initialize=False`` leaves the weights unset, for :meth:`set_state` to fill."""
        self.cfg = cfg
        self.n_features = n_features
        rng = np.random.default_rng(seed)
        widths = (n_features, *cfg.hidden)
        shapes = list(zip(widths[:-1], widths[1:], strict=True))
        self.columns = columns
        if columns is not None:
            c0, c1 = columns
            if len(cfg.hidden) != 1 or not 0 <= c0 < c1 <= cfg.hidden[0]:
                raise ValueError(
                    f"units {c0}..{c1 - 1} of hidden={list(cfg.hidden)}: only a one-layer "
                    f"stack splits by units, into ranges within its width"
                )
            shapes = [(n_features, c1 - c0)]
        if not initialize:
            self.weights = [np.empty(shape, np.float32) for shape in shapes]
        elif columns is None:
            self.weights = [rng.standard_normal(shape, np.float32) for shape in shapes]
        else:
            self.weights = [_normal_columns(rng, n_features, cfg.hidden[0], columns)]
        for w in self.weights if initialize else ():
            w *= np.float32(cfg.init_std)
        self.biases = [np.zeros(shape[1], np.float32) for shape in shapes]
        n_later = len(self.params()) - 1
        # the sparse input layer's moments as cfg.moment_dtype; the small dense layers'
        # float32 (numpy arithmetic)
        first = STORAGE[cfg.moment_dtype]
        self.moments = [
            (np.zeros(p.shape, dtype), np.zeros(p.shape, dtype))
            for p, dtype in zip(self.params(), [first] + [np.float32] * n_later, strict=True)
        ]
        # updates of each input feature's row, for its bias correction (the dense layers
        # step every time, so the global step corrects them)
        self.row_updates = np.zeros(n_features, np.int32)
        self.step = 0

    def params(self) -> list[np.ndarray]:
        return [*self.weights, *self.biases]

    def param_names(self) -> list[str]:
        return [f"W{i}" for i in range(len(self.weights))] + [
            f"b{i}" for i in range(len(self.biases))
        ]

    def state(self) -> dict[str, np.ndarray]:
        """Every array of the stack: parameters, their Adam moments (``NAME.m/.v``) and
        the input rows' update counts (``W0.n``)."""
        out = {}
        for name, p, (m, v) in zip(self.param_names(), self.params(), self.moments, strict=True):
            out.update({name: p, f"{name}.m": m, f"{name}.v": v})
        out["W0.n"] = self.row_updates
        return out

    def set_state(self, arrays: dict[str, np.ndarray], step: int, moments: bool = True) -> None:
        """Take the arrays of :meth:`state` (same shapes) and the Adam step count; without
        ``moments``, all but the Adam moments (``NAME.m``, ``NAME.v``), which stay zero."""
        arrays = with_row_updates(arrays, "W0.n", self.n_features, step)
        state = self.state()
        for name in arrays_to_read(state, moments):
            _copy_into(state[name], arrays[name], name)
        self.step = step

    def adopt(self, arrays: dict[str, np.ndarray], step: int) -> None:
        """Make the arrays of another stack's :meth:`state` (same shapes and dtypes) this
        one's, uncopied; the other stack must not be used again."""
        mine = self.state()
        for name, value in arrays.items():
            if name not in mine or (value.shape, value.dtype) != (
                mine[name].shape,
                mine[name].dtype,
            ):
                raise ValueError(f"{name}: {value.dtype}{list(value.shape)} does not fit")
        if missing := set(mine) - set(arrays):
            raise ValueError(f"no {', '.join(sorted(missing))}")
        names = self.param_names()
        n = len(self.weights)
        self.weights = [arrays[name] for name in names[:n]]
        self.biases = [arrays[name] for name in names[n:]]
        self.moments = [(arrays[f"{name}.m"], arrays[f"{name}.v"]) for name in names]
        self.row_updates = arrays["W0.n"]
        self.step = step

    def remember(self) -> None:
        """Keep a copy of the parameters (early stopping's best model so far)."""
        self._best = [p.copy() for p in self.params()]

    def recall(self) -> bool:
        """Put back the parameters :meth:`remember` kept; False if none."""
        if getattr(self, "_best", None) is None:
            return False
        for p, kept in zip(self.params(), self._best, strict=True):
            p[...] = kept
        return True

    def forward(self, X: CSR) -> tuple[np.ndarray, list[np.ndarray]]:
        """Last hidden activations ``[B, hidden[-1]]`` and the activations of each layer."""
        z = sparse_input.forward(X.indptr, X.indices, X.values(), self.weights[0], self.biases[0])
        acts = [np.maximum(z, 0, out=z)]
        for W, b in zip(self.weights[1:], self.biases[1:], strict=True):
            z = acts[-1] @ W
            z += b
            acts.append(np.maximum(z, 0, out=z))
        return acts[-1], acts

    def backward(self, X: CSR, acts: list[np.ndarray], grad_h: np.ndarray) -> None:
        """Back-propagate ``d loss / d h`` and take one Adam step on every layer. (Dropout
        on ``h`` belongs to the wide layer: its gradient arrives already masked.)"""
        self.step += 1
        cfg = self.cfg
        lr_t = adam_lr(cfg, self.step)  # of the dense parameters
        n = len(self.weights)
        grad = grad_h * (acts[-1] > 0)  # d h / d z of the ReLU
        for layer in range(n - 1, 0, -1):
            W = self.weights[layer]
            grad_W = acts[layer - 1].T @ grad
            grad_below = (grad @ W.T) * (acts[layer - 1] > 0)
            self._adam(layer, grad_W, lr_t)
            self._adam(n + layer, grad.sum(axis=0), lr_t)
            grad = grad_below
        m, v = self.moments[0]
        empty = np.zeros(0, np.float32)
        adam.adam_rows(
            X.indptr[:-1],
            X.indptr[1:],
            X.indices,
            X.values(),
            np.ascontiguousarray(grad),
            self.weights[0],
            m,
            v,
            empty,
            empty,
            empty,
            self.row_updates,
            scheduled_lr(cfg, self.step, cfg.input_lr),
            cfg.beta1,
            cfg.beta2,
            cfg.eps,
            cfg.optimizer == "dense-adam",
            np.zeros((0, 0), np.float32),
            cfg.seed + self.step,
            numba.get_num_threads(),
        )
        self._adam(n, grad.sum(axis=0), lr_t)

    def _adam(self, i: int, grad: np.ndarray, lr_t: float) -> None:
        m, v = self.moments[i]
        cfg = self.cfg
        adam.adam_dense(
            self.params()[i], grad.astype(np.float32), m, v, lr_t, cfg.beta1, cfg.beta2, cfg.eps
        )


def _normal_columns(
    rng: np.random.Generator, rows: int, width: int, columns: tuple[int, int]
) -> np.ndarray:
    """Columns ``c0:c1`` of ``rng.standard_normal((rows, width))``, drawn a block of rows
    at a time (the stream is the same; the whole matrix is never held)."""
    c0, c1 = columns
    out = np.empty((rows, c1 - c0), np.float32)
    block = max(1, (1 << 24) // width)
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        out[start:stop] = rng.standard_normal((stop - start, width), np.float32)[:, c0:c1]
    return out


def gather_units(names, columns: tuple[int, int], sources: list) -> dict[str, np.ndarray]:
    """Arrays ``names`` of units ``c0 .. c1-1`` of a one-layer stack, cut out of
    ``sources``: ``(a, b, get)`` for a holder of units ``a .. b-1`` whose ``get(name)`` is
    its array (None if it lacks it). Every array's last axis is the units', but the input
    rows' update counts ``W0.n``, which every holder has whole."""
    c0, c1 = columns
    out: dict[str, np.ndarray] = {}
    for name in names:
        for a, b, get in sources:
            if b <= c0 or a >= c1 or (value := get(name)) is None:
                continue
            if name == "W0.n":
                out[name] = value
                break
            if name not in out:
                out[name] = np.empty((*value.shape[:-1], c1 - c0), value.dtype)
            lo, hi = max(a, c0), min(b, c1)
            out[name][..., lo - c0 : hi - c0] = value[..., lo - a : hi - a]
    return out


def unit_ranges(width: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous ranges of units, as even as can be, covering ``0 .. width-1``."""
    if not 1 <= n <= width:
        raise ValueError(f"cannot split {width} units into {n} parts")
    bounds = [width * i // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _copy_into(target: np.ndarray, value: np.ndarray, name: str) -> None:
    if value.shape != target.shape:
        raise ValueError(f"{name}: shape {value.shape}, the model needs {target.shape}")
    target[...] = convert(value, target)  # moments: float32 or bfloat16

"""A linear classifier of its own for each frequent label, fused beside the network.

Where labels are frequent and many a row, the label trees (omikuji, PECOS) still ordered a
row's frequent labels better than the network and the neighbours: each of their labels
has a classifier over every input feature, trained against its own negatives. The labels
with at least ``min_count`` training rows (the ``max_labels`` most frequent) get the same
here: an L2-loss SVM (:mod:`dslide_dask.kernels.label_svm`) on the unit-normalised input
rows, a few seconds for hundreds of labels. Their scores are one more source of votes for
:func:`~dslide_dask.model.fusion.fused_topk`. Measured in docs/accuracy.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.kernels import label_svm
from dslide_dask.kernels.neighbours import normalised
from dslide_dask.model.row_chunks import row_chunks

#: The SVMs' C (on unit rows; liblinear's default, and the best of 0.5, 1, 2 and 4 on both
#: Debian sets: docs/accuracy.md).
C = 1.0
#: Passes of dual coordinate descent over the rows (debian-files P@1 0.7962 after 2,
#: 0.8024 after 4, 0.8035 after 6, 0.8029 after 10: docs/accuracy.md).
PASSES = 6
#: Weights of magnitude at most this are dropped once trained (omikuji's threshold too):
#: debian-files keeps 2.2M of 82M, P@1 as with 0.01 (10.5M kept; docs/accuracy.md).
PRUNE = 0.1
#: Bytes of dense weights and dual variables (a float a feature and a row, for each
#: label) trained at once: more labels are trained in groups.
GROUP_BYTES = 768 << 20
#: Arrays that define a trained set (:meth:`LabelClassifiers.state`).
ARRAYS = ("labels", "w_ptr", "w_col", "w_val", "bias")


@dataclass(frozen=True)
class LabelClassifiers:
    """Trained classifiers: ``labels[k]`` is column ``k``'s label; its weights are stored
    by feature (``w_col/w_val[w_ptr[f]:w_ptr[f+1]]``), then ``bias[k]``."""

    labels: np.ndarray
    w_ptr: np.ndarray
    w_col: np.ndarray
    w_val: np.ndarray
    bias: np.ndarray

    @classmethod
    def fit(
        cls,
        X: CSR,
        Y: CSR,
        min_count: int,
        max_labels: int,
        seed: int,
        passes: int = PASSES,
    ) -> LabelClassifiers | None:
        """Classifiers of the labels with at least ``min_count`` rows in ``Y`` (the
        ``max_labels`` most frequent), trained on ``X``; None if no label has as many."""
        counts = np.bincount(Y.indices, minlength=Y.n_cols)
        frequent = np.flatnonzero(counts >= max(1, min_count))
        if len(frequent) == 0 or max_labels == 0:
            return None
        labels = np.sort(frequent[np.argsort(-counts[frequent], kind="stable")[:max_labels]])
        ptr, idx, val = X.indptr, X.indices, normalised(X.indptr, X.values())
        rows = np.repeat(np.arange(X.n_rows), np.diff(ptr))
        sq_norms = np.bincount(rows, weights=val * val, minlength=X.n_rows).astype(np.float32)
        rng = np.random.default_rng([seed, 0x5F3])
        orders = [rng.permutation(X.n_rows) for _ in range(passes)]
        group = max(1, GROUP_BYTES // (4 * (X.n_cols + X.n_rows)))
        parts, bias, threads = [], [], numba.get_num_threads()
        for start in range(0, len(labels), group):
            cols = labels[start : start + group]
            y_ptr, y_idx = _columns_of(Y, cols)
            W = np.zeros((X.n_cols, len(cols)), np.float32)
            b = np.zeros(len(cols), np.float32)
            alpha = np.zeros((X.n_rows, len(cols)), np.float32)
            for order in orders:
                label_svm.dcd_pass(
                    ptr, idx, val, sq_norms, y_ptr, y_idx, order, W, b, alpha, C, threads
                )
            del alpha
            kept = np.abs(W) > PRUNE
            _, col = np.nonzero(kept)  # row-major: by feature
            parts.append((kept.sum(axis=1), col + start, W[kept]))
            bias.append(b)
        return cls(labels.astype(np.int64), *_by_feature(parts, X.n_cols), np.concatenate(bias))

    def votes(self, X: CSR, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``m`` best labels by its classifiers' scores (in (0, 1]) and those
        scores; -1/0 past the classified labels."""
        return self.top(X.indptr, X.indices, normalised(X.indptr, X.values()), m)

    def top(
        self, ptr: np.ndarray, idx: np.ndarray, val: np.ndarray, m: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`votes` of rows already in CSR with unit-normalised values (features the
        classifiers never saw count for nothing)."""
        m_here = min(m, len(self.labels))
        weights = (self.w_ptr, self.w_col, self.w_val, self.bias)
        cols, scores = label_svm.top_scores(ptr, idx, val, *weights, m_here, row_chunks())
        ids = np.where(cols >= 0, self.labels[np.maximum(cols, 0)], -1)
        if m_here < m:
            pad = m - m_here
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, pad)))
        return ids, scores

    @property
    def n_features(self) -> int:
        return len(self.w_ptr) - 1

    def state(self) -> dict[str, np.ndarray]:
        """The arrays that define the classifiers (:data:`ARRAYS`)."""
        return {name: getattr(self, name) for name in ARRAYS}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], n_labels: int) -> LabelClassifiers:
        """Classifiers from :meth:`state`'s arrays, checked (ValueError naming the array)."""
        labels, w_ptr, w_col, w_val, bias = (np.asarray(arrays[name]) for name in ARRAYS)
        K = len(labels)
        if labels.ndim != 1 or bias.shape != (K,) or K == 0:
            raise ValueError("labels and bias must be two arrays of the same length")
        if K and (labels.min() < 0 or labels.max() >= n_labels):
            raise ValueError(f"labels must lie in [0, {n_labels})")
        if w_ptr.ndim != 1 or len(w_ptr) < 1 or w_ptr[0] != 0 or np.any(np.diff(w_ptr) < 0):
            raise ValueError("w_ptr must start at 0 and never decrease")
        if w_col.shape != w_val.shape or w_ptr[-1] != len(w_col):
            raise ValueError("w_col and w_val must hold w_ptr[-1] entries")
        if len(w_col) and (w_col.min() < 0 or w_col.max() >= K):
            raise ValueError(f"w_col must lie in [0, {K})")
        return cls(
            labels.astype(np.int64),
            w_ptr.astype(np.int64),
            w_col.astype(np.int32),
            w_val.astype(np.float32),
            bias.astype(np.float32),
        )


def _columns_of(Y: CSR, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's labels among ``cols`` (sorted), as positions in it: ``(ptr, positions)``."""
    pos = np.searchsorted(cols, Y.indices)
    hit = (pos < len(cols)) & (cols[np.minimum(pos, len(cols) - 1)] == Y.indices)
    rows = np.repeat(np.arange(Y.n_rows), np.diff(Y.indptr))[hit]
    ptr = np.zeros(Y.n_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=Y.n_rows), out=ptr[1:])
    return ptr, pos[hit].astype(np.int64)


def _by_feature(parts: list, n_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pruned groups of columns (each by feature) as one set of arrays by feature."""
    counts = np.sum([c for c, _, _ in parts], axis=0)
    ptr = np.zeros(n_features + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    if len(parts) == 1:
        return ptr, parts[0][1].astype(np.int32), parts[0][2]
    feature = np.concatenate([np.repeat(np.arange(n_features), c) for c, _, _ in parts])
    order = np.argsort(feature, kind="stable")
    col = np.concatenate([p[1] for p in parts])[order].astype(np.int32)
    return ptr, col, np.concatenate([p[2] for p in parts])[order]

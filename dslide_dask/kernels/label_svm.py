"""Linear classifiers of the frequent labels: L2-regularised L2-loss SVMs over sparse rows.

Each label gets ``min_w 0.5 |w|^2 + C sum_i max(0, 1 - y_i (w . x_i + b))^2`` (the bias as
a feature of value 1, as liblinear's), solved by dual coordinate descent (Hsieh et al.,
ICML 2008), the solver the label trees' leaves use. Every label's problem reads the same
rows, so the labels step in lockstep: one walk over the rows reads each row's features
once and updates every label's dual variable and weights (a row's weights of all labels
lie together, ``W[feature, label]``). Threads take disjoint blocks of labels, so a label's
weights depend only on the row order: the same whatever the number of threads.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def dcd_pass(
    ptr: np.ndarray,
    idx: np.ndarray,
    val: np.ndarray,
    sq_norms: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    order: np.ndarray,
    W: np.ndarray,
    bias: np.ndarray,
    alpha: np.ndarray,
    C: float,
    n_blocks: int,
) -> None:
    """One pass of dual coordinate descent over the rows in ``order``, for every label
    (a column of ``W [features, labels]``, of ``bias`` and of ``alpha [rows, labels]``,
    updated in place). Row ``i`` is ``idx/val[ptr[i]:ptr[i+1]]`` (squared norm
    ``sq_norms[i]``); its positive labels are ``y_idx[y_ptr[i]:y_ptr[i+1]]`` (columns)."""
    K = W.shape[1]
    n_blocks = max(1, min(K, n_blocks))
    for blk in numba.prange(n_blocks):
        k0, k1 = blk * K // n_blocks, (blk + 1) * K // n_blocks
        dcd_block(ptr, idx, val, sq_norms, y_ptr, y_idx, order, W, bias, alpha, C, k0, k1)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def dcd_block(
    ptr: np.ndarray,
    idx: np.ndarray,
    val: np.ndarray,
    sq_norms: np.ndarray,
    y_ptr: np.ndarray,
    y_idx: np.ndarray,
    order: np.ndarray,
    W: np.ndarray,
    bias: np.ndarray,
    alpha: np.ndarray,
    C: float,
    k0: int,
    k1: int,
) -> None:
    """:func:`dcd_pass` for the labels ``k0:k1`` alone, on the calling thread."""
    D = np.float32(0.5 / C)
    one, zero = np.float32(1.0), np.float32(0.0)
    width = k1 - k0
    b = bias[k0:k1]
    z = np.empty(width, np.float32)
    y = np.empty(width, np.float32)
    d = np.empty(width, np.float32)
    for o in range(order.shape[0]):
        i = order[o]
        lo, hi = ptr[i], ptr[i + 1]
        z[:] = b
        y[:] = -one
        for q in range(lo, hi):
            w, x = W[idx[q], k0:k1], val[q]
            for k in range(width):
                z[k] += x * w[k]
        for q in range(y_ptr[i], y_ptr[i + 1]):
            if k0 <= y_idx[q] < k1:
                y[y_idx[q] - k0] = one
        a = alpha[i, k0:k1]
        step = one / (sq_norms[i] + one + D)
        moved = 0
        for k in range(width):
            old = a[k]
            new = max(old - (y[k] * z[k] - one + D * old) * step, zero)
            d[k] = (new - old) * y[k]
            a[k] = new
            moved += new != old
        if moved == 0:
            continue
        for k in range(width):
            b[k] += d[k]
        for q in range(lo, hi):
            w, x = W[idx[q], k0:k1], val[q]
            for k in range(width):
                w[k] += x * d[k]


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def top_scores(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    w_ptr: np.ndarray,
    w_col: np.ndarray,
    w_val: np.ndarray,
    bias: np.ndarray,
    m: int,
    n_chunks: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """Each query row's ``m`` best label columns and their scores ``exp(-max(0, 1 -
    margin)^2)`` (the squared hinge's likelihood, in (0, 1]), from weights stored by
    feature (``w_col/w_val[w_ptr[f]:w_ptr[f+1]]``); -1/0 past a row's last."""
    n, K = q_ptr.shape[0] - 1, bias.shape[0]
    n_features = w_ptr.shape[0] - 1
    ids = np.full((n, m), -1, np.int64)
    scores = np.zeros((n, m), np.float32)
    n_chunks = max(1, min(n, n_chunks))
    for c in numba.prange(n_chunks):
        margin = np.empty(K, np.float32)
        for i in range(c * n // n_chunks, (c + 1) * n // n_chunks):
            margin[:] = bias
            for q in range(q_ptr[i], q_ptr[i + 1]):
                f, x = q_idx[q], q_val[q]
                if f >= n_features:
                    continue
                for e in range(w_ptr[f], w_ptr[f + 1]):
                    margin[w_col[e]] += x * w_val[e]
            # the best margins are the best scores (the score rises with the margin)
            best = np.argsort(-margin, kind="mergesort")[:m]
            for j in range(best.shape[0]):
                loss = max(np.float32(0.0), np.float32(1.0) - margin[best[j]])
                ids[i, j] = best[j]
                scores[i, j] = np.exp(-loss * loss)
    return ids, scores

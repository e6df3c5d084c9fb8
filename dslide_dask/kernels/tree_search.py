"""A label tree's own search: the leaf nodes of least loss above the leaves, for a row.

Re-ranking scores only the candidates other sources name (:mod:`.tree_query`); a label
those lists miss is never scored, however low its path loss. Here every classifier above
the leaves is scored in one pass over the row, by feature as re-ranking scores them
(:func:`~dslide_dask.kernels.tree_inner.inner_losses`), and each leaf node's loss above
the leaves is the sum over the few children on its path: the best nodes' labels are
those whose path loss can be least (their leaf classifiers decide among them).
"""

import numba
import numpy as np

from dslide_dask.kernels.tree_inner import inner_losses


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def best_leaves(
    q_ptr: np.ndarray,
    q_idx: np.ndarray,
    q_val: np.ndarray,
    leaf_paths: np.ndarray,
    bias: np.ndarray,
    f_ptr: np.ndarray,
    f_child: np.ndarray,
    f_val: np.ndarray,
    n_inner: int,
    f_slot: np.ndarray,
    f_dense: np.ndarray,
    beam: int,
    n_chunks: int,
) -> np.ndarray:
    """Per row of ``q`` (unit values, features ascending): the ``beam`` leaf nodes of least
    loss above the leaves, best first. ``leaf_paths[n]`` are the children above the leaves
    on leaf node ``n``'s path (``tree_query.child_paths`` at its first position, the leaf
    level left out); the classifiers above the leaves are given by feature, as
    ``tree_query.path_losses`` takes them, so every leaf node's loss comes from one pass
    over the row."""
    n = q_ptr.shape[0] - 1
    n_leaves, depth = leaf_paths.shape
    beam = max(0, min(beam, n_leaves))
    out = np.empty((n, beam), np.int64)
    n_chunks = max(1, min(n, n_chunks))
    for chunk in numba.prange(n_chunks):
        loss_of = np.empty(n_inner, np.float32)
        best = np.empty(beam, np.float32)
        for i in range(chunk * n // n_chunks, (chunk + 1) * n // n_chunks):
            lo, hi = q_ptr[i], q_ptr[i + 1]
            if n_inner:
                inner_losses(q_idx, q_val, lo, hi, bias, f_ptr, f_child, f_val, f_slot,
                             f_dense, loss_of)  # fmt: skip
            best[:] = np.inf
            for node in range(n_leaves):
                loss = np.float32(0.0)
                for v in range(depth):
                    loss += loss_of[leaf_paths[node, v]]
                if beam == 0 or loss >= best[beam - 1]:
                    continue
                at = beam - 1  # the beam best so far, ascending; ties keep the first
                while at > 0 and best[at - 1] > loss:
                    best[at] = best[at - 1]
                    out[i, at] = out[i, at - 1]
                    at -= 1
                best[at] = loss
                out[i, at] = node
    return out


@numba.njit(cache=True, nogil=True)
def node_labels(nodes: np.ndarray, starts: np.ndarray, perm: np.ndarray, widest: int) -> np.ndarray:
    """The labels (``perm`` in tree order) of each row's leaf ``nodes`` (node ``n`` holds
    positions ``starts[n]:starts[n+1]``), a row's side by side, -1 after its last."""
    n, beam = nodes.shape
    out = np.full((n, beam * widest), -1, np.int64)
    for i in range(n):
        at = 0
        for b in range(beam):
            node = nodes[i, b]
            for p in range(starts[node], starts[node + 1]):
                out[i, at] = perm[p]
                at += 1
    return out

"""A served row's label trees: the losses of the candidates that can be among its best.

Whole trees in one process answer here; trees in pieces over workers answer in rounds
(:mod:`~dslide_dask.model.tree_shards`) and rank the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dslide_dask.kernels import tree_query
from dslide_dask.model.label_tree import LabelTree, sorted_rows
from dslide_dask.model.row_chunks import row_chunks

#: Rows a served tree query scores at once: its scratch (each candidate's loss above the
#: leaves, leaf and shared margin a tree, and bound) is 16-28 bytes a candidate.
BLOCK_ROWS = 1024


def forest_topk_losses(
    trees: Sequence[LabelTree],
    query: tuple[np.ndarray, np.ndarray, np.ndarray],
    ids: np.ndarray,
    scores: np.ndarray,
    power: float,
    k: int,
) -> np.ndarray:
    """The mean of the ``trees``' :meth:`LabelTree.losses` of the candidates ``ids``
    that can be among each row's ``k`` best by ``scores * exp(-power * loss)`` (the
    others ``inf``: they are not), as a served row needs them: each candidate's leaf
    classifiers are scored only while its loss above the leaves leaves it a chance
    (:func:`~dslide_dask.kernels.tree_query.bounded_losses`; the longest leaves' by
    feature, :attr:`LabelTree.hot`)."""
    ptr, idx, val = sorted_rows(*query)
    served = [tree.served for tree in trees]
    n_features = max(max(t.n_features for t in trees), int(idx.max(initial=-1)) + 1)
    ids = np.ascontiguousarray(ids, np.int64)
    scores = np.ascontiguousarray(scores, np.float32)
    tree_args = (
        tuple(t.position for t in trees), tuple(s[0] for s in served),  # the paths
        tuple(t.w_ptr for t in trees), tuple(t.w_feature for t in trees),
        tuple(t.w_val for t in trees), tuple(t.bias for t in trees),
        tuple(s[1] for s in served), tuple(s[2] for s in served),  # inner, by feature
        tuple(s[3] for s in served), tuple(s[4] for s in served),
    )  # fmt: skip
    dense = tuple(s[5] for s in served), tuple(s[6] for s in served)  # slots, dense rows
    hot = tuple(zip(*(t.hot for t in trees), strict=True))  # the longest leaves, by feature
    out = np.empty(ids.shape, np.float32)
    for a in range(0, len(ids), BLOCK_ROWS):  # the kernel's scratch grows with the rows
        b = min(a + BLOCK_ROWS, len(ids))
        out[a:b] = tree_query.bounded_losses(
            ptr[a : b + 1], idx, val, ids[a:b], scores[a:b], float(power), int(k), *tree_args,
            n_features, row_chunks(), tree_query.SHARED_ROWS, *dense, hot,
        )  # fmt: skip
    return out

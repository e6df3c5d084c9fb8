"""Each label's centroid in the input space, a score for labels seen a few times.

The label trees' edge where nearly every label is rare (a label with 2-20 training rows)
is that a label is one point of its own, the normalised sum of its rows (PECOS' PIFA
label features), not the rows apart. The neighbours' votes count a label once per point
near the query; a centroid weighs what its rows share. The cosine of a row with a
candidate label's centroid is one more source of votes for
:func:`~dslide_dask.model.fusion.fused_topk`, in place of the tail boost: P@1 0.2286 ->
0.2351 on debian-files' labels of at most 20 rows, PSP@5 0.2196 -> 0.2331 on Debian-26K
at the same P@1 (docs/accuracy.md).

Centroids are derived from the neighbour index's rows and labels, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.kernels import label_centroids as kernels
from dslide_dask.kernels.neighbours import row_cosines, transpose
from dslide_dask.model.row_chunks import row_chunks

#: Centroid entries under this share of its unit norm are dropped: Debian-26K keeps 6.0M
#: of 11.9M at the same P@k (0.03: 3.2M, but rare labels lose; docs/accuracy.md).
PRUNE = 0.01
#: Candidates a row's centroids score once the fusion's weights are known: the best by the
#: other sources, as many as the network's and both votes' lists hold (3 x 100), so every
#: candidate, as when held rows choose the weights. At 100, weights that mix the network
#: and both votes lost the centroids on the candidates past the cut, which the held rows
#: never saw: debian-files-rare's default fell below its share-0 model (issue 51).
SCORED = 300
#: Blocks of labels a build splits into per thread (a frequent label costs thousands of
#: rare ones: more blocks than threads keep the threads busy).
BLOCKS_PER_THREAD = 64


@dataclass(frozen=True, eq=False)
class LabelCentroids:
    """Label ``l``'s centroid is ``idx/val[ptr[l]:ptr[l+1]]`` (features ascending)."""

    ptr: np.ndarray
    idx: np.ndarray
    val: np.ndarray
    n_features: int

    @classmethod
    def build(
        cls,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray],
        y_ptr: np.ndarray,
        y_idx: np.ndarray,
        n_labels: int,
        n_features: int,
        prune: float = PRUNE,
    ) -> LabelCentroids:
        """The centroids of ``n_labels`` labels from unit-norm ``rows`` (CSR: ptr,
        features, values) and their labels (``y_idx[y_ptr[i]:y_ptr[i+1]]``: row i's)."""
        ones = np.ones(len(y_idx), np.float32)
        label_ptr, label_pts, _ = transpose(y_ptr, y_idx, ones, n_labels)
        blocks = BLOCKS_PER_THREAD * numba.get_num_threads()
        ptr, idx, val = kernels.centroids(
            *rows, label_ptr, label_pts, n_features, float(prune), blocks
        )
        return cls(ptr, idx, val, n_features)

    @property
    def n_labels(self) -> int:
        return len(self.ptr) - 1

    def cosines(
        self, query: tuple[np.ndarray, np.ndarray, np.ndarray], ids: np.ndarray
    ) -> np.ndarray:
        """The cosine of each ``query`` row (CSR of unit rows) with the centroid of each
        of its candidates ``ids[i, j]`` (0 where -1)."""
        ids = np.ascontiguousarray(ids, np.int64)
        if ids.size and ids.max() >= self.n_labels:
            raise ValueError(f"a candidate label is out of range [0, {self.n_labels})")
        return row_cosines(
            *query, self.ptr, self.idx, self.val, ids, self.n_features, row_chunks(len(ids))
        )

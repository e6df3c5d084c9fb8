"""The training points nearest a row in the hidden space, without scoring every point.

A served row's hidden-space votes compare its hidden vector with every training point's:
at 50K points that is a 50K x 128 product a row (26 MB read, about 1.8 ms on one core),
the largest part of a fused answer, and it grows with the training set. As the output
layer's index (:mod:`.output_index`), faiss's inverted file with half-precision codes
proposes ``candidates`` points a row from the ``probes`` nearest of ``lists`` k-means
cells, and the votes then score those exactly from the float32 vectors
(:func:`~dslide_dask.kernels.neighbours.candidate_neighbour_votes`): the neighbours found
carry their exact similarities. The vectors are L2-normalised, so the L2-nearest are the
cosine-nearest. Built by ``build_index`` beside the output index, and again on ``load``
(a second for 50K points): it is derived from the saved vectors, so nothing new is stored.
"""

from __future__ import annotations

import dataclasses
import os

import numba
import numpy as np

from dslide_dask.model.output_index import FaissThreads, IndexSettings, faiss_module, new_ivf

_PAD = 16
#: Points per cell when ``lists`` is left to the search: votes need a row's 30 nearest
#: points, not its best few labels, so cells are smaller than the output index's. Debian-
#: 26K's 50K points, one thread, hidden votes of one row (every point scored: 2.1 ms):
#: 64 cells, 8 probed: 0.35 ms, fused recall@5 0.9950; 256 / 32: 0.35 ms, 0.9981;
#: 512 / 64: 0.31 ms, 0.9994 (docs/serving.md).
POINTS_PER_LIST = 100
#: Cells a query probes when ``probes`` is left to the search: one in 8, at least 16 and
#: at most 64 (a bounded cost as the training set grows).
PROBES_MIN, PROBES_MAX = 16, 64


class PointSearch:
    """A faiss IVF index over unit hidden vectors (one a training point), and how it is
    searched: ``probes`` lists a query, ``candidates`` points proposed."""

    def __init__(self, index, settings: IndexSettings) -> None:
        self.index, self.settings = index, settings

    @classmethod
    def build(cls, points: np.ndarray, settings: IndexSettings | None = None) -> PointSearch:
        """The index of ``points`` (``(n_points, width)``, unit rows); ``lists`` left at 0:
        a power of two near ``n_points / 100``, ``probes`` left at 0: a cell in 8 (16 to
        64)."""
        n, width = points.shape
        given = settings or IndexSettings()
        lists = given.lists or int(2 ** np.clip(round(np.log2(max(n, 1) / POINTS_PER_LIST)), 0, 16))
        lists = min(lists, max(n, 1))
        probes = min(given.probes or max(PROBES_MIN, min(lists // 8, PROBES_MAX)), lists)
        settings = dataclasses.replace(given, lists=lists, probes=probes)
        padded = -(-width // _PAD) * _PAD
        rng = np.random.default_rng(settings.seed)
        sample = np.sort(
            rng.choice(n, min(n, settings.lists * settings.train_per_list), replace=False)
        )
        index = new_ivf(padded, settings)
        with FaissThreads(settings.threads or os.cpu_count() or 1):
            index.train(_padded(points[sample], padded))
            for start in range(0, n, 1 << 16):
                index.add(_padded(points[start : start + (1 << 16)], padded))
        return cls(index, settings)

    def candidates(self, query: np.ndarray, m: int) -> np.ndarray:
        """Ids of the ``m`` points nearest each unit row of ``query`` by the index (-1:
        fewer); faiss on as many threads as numba has here."""
        faiss = faiss_module()
        params = faiss.SearchParametersIVF(nprobe=self.settings.probes)
        with FaissThreads(numba.get_num_threads()):
            return self.index.search(_padded(query, self.index.d), m, params=params)[1]


def _padded(rows: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), np.float32)
    out[:, : rows.shape[1]] = rows
    return out

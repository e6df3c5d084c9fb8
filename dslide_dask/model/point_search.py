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
#: Fewest cells a query probes when ``probes`` is left to the search: a quarter of the
#: 64 cells of 50K points (Debian-26K: recall@5 of the fused answer 0.9991 against every
#: point scored, 0.9952 with 8; docs/serving.md).
PROBES_MIN = 16


class PointSearch:
    """A faiss IVF index over unit hidden vectors (one a training point), and how it is
    searched: ``probes`` lists a query, ``candidates`` points proposed."""

    def __init__(self, index, settings: IndexSettings) -> None:
        self.index, self.settings = index, settings

    @classmethod
    def build(cls, points: np.ndarray, settings: IndexSettings | None = None) -> PointSearch:
        """The index of ``points`` (``(n_points, width)``, unit rows); ``lists`` left at 0
        is chosen for the point count as the output index's is, ``probes`` as a cell in
        64, at least :data:`PROBES_MIN`."""
        n, width = points.shape
        given = settings or IndexSettings()
        settings = given.for_rows(n)
        if not given.probes:  # votes need the k nearest, not the best few: scan more
            probes = min(settings.lists, max(PROBES_MIN, settings.lists // 64))
            settings = dataclasses.replace(settings, probes=probes)
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

"""A fitted ``SlideClassifier`` answering through an index over its output layer.

:meth:`ServingMixin.build_index` builds an :class:`~dslide_dask.model.output_index.
OutputIndex`; from then on ``predict``, ``predict_topk`` and ``evaluate`` take each row's
best labels from its candidates, scored exactly, instead of scoring every label (the
network's top candidates that the neighbours' votes are fused with, too), and the
hidden-space neighbours from the points an approximate search proposes
(:mod:`~dslide_dask.model.point_search`). ``save`` stores the output index beside the
model and ``load`` reads it back, checked, whatever the shard count (and builds the
points' search again: it derives from the saved vectors).
A model on a cluster answers exactly: its rows live in actors (``dslide predict --index``
serves a saved model's index there, one part per shard).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Self

import fsspec
import numpy as np

from dslide_dask.checkpoint.output_index import (
    has_output_index,
    load_output_index,
    save_output_index,
)
from dslide_dask.checkpoint.store import Checkpoint
from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.estimator._state import EstimatorState
from dslide_dask.local_trainer import LocalTrainer
from dslide_dask.metrics import xc_metrics
from dslide_dask.model.fused import served_neighbours
from dslide_dask.model.output_index import IndexSettings, OutputIndex


class ServingMixin(EstimatorState):
    """``output_index_`` (an :class:`OutputIndex`, or None) and the top-k through it."""

    def build_index(self, **settings) -> Self:
        """Index the output layer, so predictions need not score every label.

        Each row's ``candidates`` best rows by the index (faiss IVF-fp16 over the layer,
        ``docs/serving.md``) and the ``head`` rows are scored exactly, and the best of
        them returned: the scores are the exact logits of the labels found, and the
        labels the exact ones in all but a few rows in ten thousand. A model that keeps
        neighbours (``neighbours > 0``) gets the same kind of index over its training
        points' hidden vectors, so a row's hidden-space votes need not score every point.
        Training the model further drops both. Needs faiss (``pip install "dslide-dask[serve]"``).

        Parameters
        ----------
        **settings
            :class:`~dslide_dask.model.output_index.IndexSettings`: ``lists``,
            ``probes``, ``candidates`` (100), ``head`` (1024), ``codes`` (``"fp16"``,
            ``"sq8"`` or ``"flat"``), ``train_per_list``, ``iterations``, ``seed``,
            ``threads`` (0: every core; ``lists`` and ``probes`` 0: chosen for the
            layer's size).

        Returns
        -------
        SlideClassifier
            This estimator, with ``output_index_`` set.
        """
        self._check_fitted()
        parsed = IndexSettings.of(settings)
        if not isinstance(self.trainer_, LocalTrainer):
            raise ValueError(
                "build_index: the model is on a cluster, where it answers exactly; save() "
                "it and run `dslide index MODEL`, then `dslide predict --index`, or load "
                "it in this process (SlideClassifier.load(url)) to build one"
            )
        trainer = self.trainer_
        counts = trainer.labels.counts if trainer.labels.rows else None
        self.output_index_ = OutputIndex.build(trainer.network.shards, parsed, counts)
        self._index_step = self._step
        self._search_points(parsed)
        return self

    def drop_index(self) -> Self:
        """Answer exactly again: forget the output index and what the neighbours serve
        through (their points' search and served postings), as a model fitted without
        :meth:`build_index`, which makes them again.

        Returns
        -------
        SlideClassifier
            This estimator, with ``output_index_`` None.
        """
        self._check_fitted()
        self.output_index_ = None
        index = getattr(self, "neighbours_", None)
        if index is not None:
            self.neighbours_ = dataclasses.replace(index, search=None, serving=None)
        return self

    def _search_points(self, settings: IndexSettings) -> None:
        """The neighbours served faster too, where the model keeps enough points to gain
        (:func:`~dslide_dask.model.fused.served_neighbours`)."""
        index = getattr(self, "neighbours_", None)
        if index is not None:
            self.neighbours_ = served_neighbours(index, settings)

    def _serving_index(self) -> OutputIndex | None:
        """The output index, if built for the weights the model has now (dropped, with
        a warning, once the model trained on)."""
        index = getattr(self, "output_index_", None)
        if index is not None and getattr(self, "_index_step", None) != self._step:
            warnings.warn(
                "the model trained on after build_index(): its output index no longer "
                "matches the weights and is dropped; call build_index() again",
                UserWarning,
                stacklevel=3,
            )
            self.output_index_ = index = None
        return index

    def _network_topk(self, X: CSR, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        """The network's top-k ids and logits: through the output index when one is
        built and ``exact`` is asked (``exact=False``: the LSH tables, as without one)."""
        index = self._serving_index() if exact else None
        if index is None:
            return self.trainer_.topk_scores(X, k, exact)
        return index.topk_scores(self._local_trainer().network, X, k)

    def _index_metrics(self, data: XCDataset, ks: tuple[int, ...]) -> dict[str, float]:
        """``evaluate``'s scores of the top-k through the output index."""
        top, _ = self._network_topk(data.X, max(ks), True)
        labels = self._local_trainer().labels
        return xc_metrics(top, data.Y, ks, **labels.metric_args())

    def _local_trainer(self) -> LocalTrainer:
        """The trainer of a model in this process: the only one an output index is built
        for or loaded into (:meth:`build_index`, :meth:`_load_output_index`)."""
        trainer = self.trainer_
        if not isinstance(trainer, LocalTrainer):
            raise TypeError("an output index serves a model in this process only")
        return trainer

    def _save_output_index(self, folder_url: str, meta: dict, storage_options: dict | None) -> None:
        """At ``save``, before the commit: the output index, if built, into the folder
        ``folder_url`` of the model whose metadata so far is ``meta`` (its fingerprint)."""
        index = self._serving_index()
        if index is not None:
            fs, path = fsspec.core.url_to_fs(folder_url, **(storage_options or {}))
            save_output_index(Checkpoint(fs, path, meta), index)

    def _load_output_index(self, ckpt: Checkpoint) -> None:
        """At ``load``: the output index saved beside the model ``ckpt``, if any, checked
        (split for the shards loaded when first asked); on a cluster it is not read."""
        self.output_index_ = None
        if isinstance(self.trainer_, LocalTrainer) and has_output_index(ckpt):
            self.output_index_ = load_output_index(ckpt)
            self._index_step = self._step
            self._search_points(self.output_index_.settings)

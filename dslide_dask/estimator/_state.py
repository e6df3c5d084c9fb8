"""What the parts of ``SlideClassifier`` share, declared in one place.

The classifier is assembled from mixins (``_inputs``, ``_training``, ``_fitted``,
``_serving``, ``_neighbours``) that read and set each other's attributes and call each
other's methods. :class:`EstimatorState` declares that shared state for the type checker:
the parameters ``SlideClassifier.__init__`` sets, the fitted attributes, and the methods
one part calls on another. It holds annotations only (no values) and, for the methods,
signatures read by the type checker alone: at run time it adds nothing to the class.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Self

import numpy as np

if TYPE_CHECKING:
    from dslide_dask.checkpoint.store import Checkpoint
    from dslide_dask.data.batches import Source
    from dslide_dask.data.csr import CSR
    from dslide_dask.data.dataset import XCDataset
    from dslide_dask.data.held import HeldRows
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.distributed.cluster_data import ClusterData
    from dslide_dask.fused_parts import FusedParts
    from dslide_dask.local_trainer import LocalTrainer
    from dslide_dask.model.config import SlideConfig
    from dslide_dask.model.fused import FusedModel
    from dslide_dask.model.fused_build import FusedRecipe
    from dslide_dask.model.neighbours import NeighbourIndex
    from dslide_dask.model.output_index import OutputIndex

    #: What a fit trains on: rows in memory, a planned URL, or (with a client) blocks
    #: kept on the cluster, which only a DistributedTrainer is given.
    TrainingData = Source | ClusterData


class EstimatorState:
    """The attributes and methods the mixins of ``SlideClassifier`` share (declarations
    only: ``SlideClassifier`` and the mixins define them)."""

    # -- parameters (set by SlideClassifier.__init__) --------------------------------------
    epochs: int
    early_stopping: bool
    n_iter_no_change: int
    tol: float
    n_threads: int | None
    random_state: Any
    n_shards: int | None
    wire_dtype: str
    pipeline: bool
    step_mode: str
    checkpoint_url: str | None
    run_name: str | None
    neighbours: int
    neighbour_weight: float | tuple[float, float] | None
    neighbour_mix: float
    label_classifiers: int
    label_centroids: float | None
    label_tree: float
    n_label_trees: int | None
    tail_exponent: float | None
    _client: Any

    # -- fitted state -----------------------------------------------------------------------
    trainer_: LocalTrainer | DistributedTrainer
    seed_: int
    epochs_done_: int
    evals_: list[dict]
    n_features_in_: int
    classes_: np.ndarray
    _multiclass: bool
    neighbours_: NeighbourIndex | None
    neighbour_weight_: tuple[float, ...] | None
    tail_exponent_: float | None
    _held: XCDataset | None
    _held_rows: HeldRows | None
    #: The fused parts a fit from storage or collections built where the model is
    #: (this process, or a worker of its cluster), or a model loaded onto a cluster.
    _fused_parts: FusedParts
    _index_rows: CSR | None
    _embed_step: int
    _weight_step: int
    output_index_: OutputIndex | None
    _index_step: int

    if TYPE_CHECKING:
        # -- SlideClassifier and scikit-learn's BaseEstimator ------------------------------
        def __init__(self, **params: Any) -> None: ...

        @property
        def client(self) -> Any: ...

        @client.setter
        def client(self, value: Any) -> None: ...

        @classmethod
        def _get_param_names(cls) -> list[str]: ...

        def get_params(self, deep: bool = True) -> dict[str, Any]: ...

        def set_params(self, **params: Any) -> Self: ...

        def config(self) -> SlideConfig: ...

        def _seed(self) -> int: ...

        def _int(self, name: str, low: int, high: int) -> int: ...

        def _float(self, name: str, low: float, high: float, **open_ends: bool) -> float: ...

        @property
        def _step(self) -> int: ...

        def _check_fitted(self) -> None: ...

        def _check_shapes(self, n_features: int, n_labels: int | None) -> None: ...

        def _threads(self) -> AbstractContextManager[None]: ...

        # -- _inputs ------------------------------------------------------------------------
        def _training_data(
            self, X: Any, Y: Any, storage_options: dict | None, classes: Any = None
        ) -> TrainingData: ...

        def _collection_data(self, X: Any, Y: Any, client: Any) -> XCDataset | ClusterData: ...

        def _features(self, X: Any, *, reset: bool) -> CSR: ...

        def _labels(self, Y: Any, name: str = "Y") -> Any: ...

        def _held_out(self, eval_set: Any, n_labels: int) -> XCDataset: ...

        # -- _training ----------------------------------------------------------------------
        def _current_client(self) -> Any: ...

        # -- _fitted ------------------------------------------------------------------------
        def _fusing(self) -> bool: ...

        def predict_topk(
            self, X: Any, k: int = 5, *, exact: bool = True, return_scores: bool = False
        ) -> Any: ...

        # -- _serving -----------------------------------------------------------------------
        def _serving_index(self) -> OutputIndex | None: ...

        def _network_topk(self, X: CSR, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]: ...

        def _index_metrics(self, data: XCDataset, ks: tuple[int, ...]) -> dict[str, float]: ...

        def _save_output_index(
            self, folder_url: str, meta: dict, storage_options: dict | None
        ) -> None: ...

        def _load_output_index(self, ckpt: Checkpoint) -> None: ...

        # -- _neighbours --------------------------------------------------------------------
        def _indexes(self, data: Any) -> bool: ...

        def _neighbour_k(self) -> int: ...

        def _recipe(self) -> FusedRecipe: ...

        def _neighbour_split(self, data: Any, seed: int) -> tuple[Any, XCDataset | None]: ...

        def _build_neighbours(self, data: Any) -> None: ...

        def _finish_neighbours(self, data: Any) -> bool: ...

        def _choose_weight(self) -> tuple[tuple[float, ...], float]: ...

        def _index_now(self) -> NeighbourIndex: ...

        def _fused(
            self, weight: tuple[float, ...] | None = None, tail: float = 0.0
        ) -> FusedModel: ...

        def _fused_topk(self, X: CSR, k: int, exact: bool) -> tuple[np.ndarray, np.ndarray]: ...

        def _fused_metrics(self, data: XCDataset, ks: tuple[int, ...], exact: bool) -> dict: ...

        def fused_model(self) -> FusedModel | None: ...

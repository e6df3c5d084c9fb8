"""Batch inference as Dask task graphs: rows read, scored and written on workers.

:mod:`.spec` holds what crosses to workers, :mod:`.model_cache` loads a model once per
worker process, :mod:`.tasks` is the per-partition work (no Dask), :mod:`.output` the
format of the results, and :mod:`.graph` builds and runs the named tasks.
"""

from dslide_dask.inference.graph import predict_to_storage, topk_blocks
from dslide_dask.inference.output import read_predictions
from dslide_dask.inference.spec import PredictSpec
from dslide_dask.inference.tasks import predict_topk_scores

__all__ = [
    "PredictSpec",
    "predict_to_storage",
    "predict_topk_scores",
    "read_predictions",
    "topk_blocks",
]

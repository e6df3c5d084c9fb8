"""Model-parallel training on Dask: shards as pinned actors, driven by a coordinator.

Orchestration only: every number is computed by :mod:`dslide_dask.model`.
"""

from dslide_dask.distributed.errors import ShardLostError
from dslide_dask.distributed.trainer import DistributedTrainer

__all__ = ["DistributedTrainer", "ShardLostError"]

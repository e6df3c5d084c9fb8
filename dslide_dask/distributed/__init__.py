"""Model-parallel training on Dask: shards as pinned actors, driven by a coordinator.

Orchestration only: every number is computed by :mod:`dslide_dask.model`.
"""

from dslide_dask.distributed.trainer import DistributedTrainer
from dslide_dask.errors import ShardLostError

__all__ = ["DistributedTrainer", "ShardLostError"]

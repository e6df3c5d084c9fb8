"""Checkpoints: the whole model as plain arrays + JSON on any fsspec URL, no pickle.

:class:`CheckpointStore` commits atomically and prunes; :func:`open_checkpoint` reads one
back (checked against sizes and checksums); :mod:`~dslide_dask.checkpoint.model` maps
hidden layers and shards to arrays and back, re-sharding when the layout differs.
"""

from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.checkpoint.model import CheckpointPolicy
from dslide_dask.checkpoint.store import Checkpoint, CheckpointStore, Folder, open_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointPolicy",
    "CheckpointStore",
    "Folder",
    "open_checkpoint",
]

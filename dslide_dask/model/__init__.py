"""Model state: layers, shards, LSH indexes. Plain numpy + numba; nothing knows of Dask."""

from dslide_dask.model.config import SlideConfig
from dslide_dask.model.network import SlideNetwork

__all__ = ["SlideConfig", "SlideNetwork"]

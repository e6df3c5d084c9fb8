"""Serving settings a trained model can be given without retraining."""

from __future__ import annotations

import dataclasses

from dslide_dask.model.config import SlideConfig
from dslide_dask.model.lsh_index import LSHIndex, MIPSIndex
from dslide_dask.model.network import SlideNetwork


def reindex(net: SlideNetwork, mips: bool = False, **overrides) -> None:
    """Give every shard new LSH tables for serving, hashed from its weights: with
    ``overrides`` of the config (e.g. more tables ``L``, codes ``K``,
    ``bucket_capacity``, ``range_pow``), and with ``mips`` the inner-product transform
    of :class:`~dslide_dask.model.lsh_index.MIPSIndex` (SimHash). Training's own tables
    are made for sampling, not for recall. Config checks name a bad value."""
    if not overrides and not mips:
        return
    cfg = serving_config(net.cfg, overrides)
    for shard in net.shards:
        if mips:
            shard.serving_index = MIPSIndex(shard.W, shard.bias, cfg, shard.index.seed)
        else:
            index = LSHIndex(shard.dim_in, cfg, shard.index.seed, shard.n_local)
            index.rebuild(shard.W)
            shard.serving_index = index


#: config fields that only shape the tables (the rest would change the model)
TABLE_FIELDS = ("L", "K", "range_pow", "bucket_capacity", "bucket_policy", "hash_family",
                "simhash_density", "bin_size", "code_bits")  # fmt: skip


def serving_config(cfg: SlideConfig, overrides: dict) -> SlideConfig:
    """``cfg`` with serving tables' ``overrides``; a ValueError names a bad one."""
    for name in overrides:
        if name not in TABLE_FIELDS:
            raise ValueError(f"index setting {name!r}: not one of {', '.join(TABLE_FIELDS)}")
    try:
        return dataclasses.replace(cfg, **overrides)
    except TypeError as err:
        raise ValueError(f"index settings {overrides}: {err}") from None

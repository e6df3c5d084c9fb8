"""Serving settings a trained model can be given without retraining."""

from __future__ import annotations

import dataclasses

import numpy as np

from dslide_dask.model.config import SlideConfig
from dslide_dask.model.lsh_index import LSHIndex, MIPSIndex
from dslide_dask.model.network import SlideNetwork


def reindex(net: SlideNetwork, mips: bool = False, **overrides) -> None:
    """Give every shard new LSH tables for serving, hashed from its weights: with
    ``overrides`` of the config (e.g. more tables ``L``, codes ``K``,
    ``bucket_capacity``, ``range_pow``), and with ``mips`` the inner-product transform
    of :class:`~dslide_dask.model.lsh_index.MIPSIndex` (SimHash; ``ranges``: its norm
    ranges, default 4). Training's own tables
    are made for sampling, not for recall. Config checks name a bad value."""
    if not overrides and not mips:
        return
    overrides = dict(overrides)
    ranges = overrides.pop("ranges", RANGES)
    cfg = serving_config(net.cfg, overrides)
    check_ranges(ranges, mips)
    for shard in net.shards:
        if mips:
            defaults = mips_defaults(shard.n_local // ranges, overrides)
            shard_cfg = dataclasses.replace(cfg, **defaults)
            shard.serving_index = MIPSIndex(shard.W, shard.bias, shard_cfg, shard.index.seed,
                                            ranges)  # fmt: skip
        else:
            index = LSHIndex(shard.dim_in, cfg, shard.index.seed, shard.n_local)
            index.rebuild(shard.W)
            shard.serving_index = index


#: config fields that only shape the tables (the rest would change the model)
TABLE_FIELDS = ("L", "K", "range_pow", "bucket_capacity", "bucket_policy", "hash_family",
                "simhash_density", "bin_size", "code_bits")  # fmt: skip


RANGES = 4  # MIPS norm ranges unless asked
ROWS_PER_BUCKET = 32  # MIPS tables' aim unless K / range_pow are given


def mips_defaults(n_rows: int, overrides: dict) -> dict:
    """SimHash codes a table, buckets and slots for ``n_rows`` rows a range, where not
    given: training's K (DWTA, 6) would leave SimHash only 2**6 buckets for them. Slots
    are 4x the mean fill: rows still crowd some buckets, and a full bucket drops rows
    (with 2x, 7% of the buckets overflowed on a Debian model)."""
    bits = int(np.clip(round(np.log2(max(n_rows, 1) / ROWS_PER_BUCKET)), 2, 18))
    out = {"K": bits, "range_pow": bits, "bucket_capacity": 4 * ROWS_PER_BUCKET}
    if "K" in overrides:
        out["range_pow"] = min(int(overrides["K"]), 18)
    return {k: v for k, v in out.items() if k not in overrides}


def check_ranges(ranges, mips: bool) -> None:
    if isinstance(ranges, bool) or not isinstance(ranges, int) or not 1 <= ranges <= 64:
        raise ValueError(f"index setting 'ranges' must be an integer in [1, 64], got {ranges!r}")
    if ranges != RANGES and not mips:
        raise ValueError("index setting 'ranges' is for the MIPS tables (--mips) only")


def serving_config(cfg: SlideConfig, overrides: dict) -> SlideConfig:
    """``cfg`` with serving tables' ``overrides`` (``ranges`` aside: see
    :func:`reindex`); a ValueError names a bad one."""
    overrides = {k: v for k, v in overrides.items() if k != "ranges"}
    for name in overrides:
        if name not in TABLE_FIELDS:
            known = ", ".join((*TABLE_FIELDS, "ranges"))
            raise ValueError(f"index setting {name!r}: not one of {known}")
    try:
        return dataclasses.replace(cfg, **overrides)
    except TypeError as err:
        raise ValueError(f"index settings {overrides}: {err}") from None

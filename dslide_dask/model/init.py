"""Initial weights of a wide layer's rows, independent of how the layer is sharded."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_INIT_BLOCK = 1 << 16


def init_rows(seed: int, rows: np.ndarray, dim: int, std: float) -> np.ndarray:
    """Initial weights ``N(0, std)`` of the given global rows of a layer, the same rows
    whatever the sharding (each block of rows has its own random stream; blocks are
    drawn in parallel: numpy's generators release the GIL)."""
    out = np.empty((len(rows), dim), np.float32)
    blocks = rows // _INIT_BLOCK

    def fill(block: int) -> None:
        values = np.random.default_rng([seed, block]).standard_normal(
            (_INIT_BLOCK, dim), np.float32
        )
        values *= np.float32(std)
        mine = np.flatnonzero(blocks == block)
        out[mine] = values[rows[mine] - block * _INIT_BLOCK]

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, np.unique(blocks).tolist()))
    return out

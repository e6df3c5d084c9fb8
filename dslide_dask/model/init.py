"""Initial weights of a wide layer's rows, independent of how the layer is sharded."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_INIT_BLOCK = 1 << 16


def init_rows(seed: int, rows: np.ndarray, dim: int, std: float) -> np.ndarray:
    """Initial weights ``N(0, std)`` of the given global rows of a layer, the same rows
    whatever the sharding: each block of rows has its own random stream, row-major, so
    the first n rows of a block are the stream's first ``n * dim`` values. Blocks are
    drawn in parallel (numpy's generators release the GIL); a block whose rows are all
    wanted, in order, is drawn straight into place."""
    out = np.empty((len(rows), dim), np.float32)
    blocks = rows // _INIT_BLOCK
    scale = np.float32(std)

    def fill(block: int) -> None:
        rng = np.random.default_rng([seed, block])
        mine = np.flatnonzero(blocks == block)
        local = rows[mine] - block * _INIT_BLOCK
        n = len(mine)
        if mine[-1] - mine[0] == n - 1 and np.array_equal(local, np.arange(n)):
            into = out[mine[0] : mine[0] + n]
            rng.standard_normal(dtype=np.float32, out=into)
            into *= scale
            return
        values = rng.standard_normal((int(local.max()) + 1, dim), np.float32)
        out[mine] = values[local] * scale

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, np.unique(blocks).tolist()))
    return out

"""An LSH index over the rows of a weight matrix, and its rebuild schedule."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import numba
import numpy as np

from dslide_dask.kernels import hashing, tables, topk
from dslide_dask.model.config import SlideConfig

_BLOCK = 1 << 15  # rows hashed at a time when (re)building: bounds temporary memory


_local = threading.local()


def seen_scratch(n_rows: int, n_items: int) -> np.ndarray:
    """Zeroed counters ``[slots, n_items]`` for :func:`~dslide_dask.kernels.topk.lsh_topk`
    (which leaves them zeroed): one set per calling thread, kept across calls, so a
    one-row query does not clear a layer-sized array (threads of a Dask worker may
    query at once)."""
    slots = max(1, min(n_rows, numba.get_num_threads()))
    kept = _local.__dict__.setdefault("seen", {})  # by layer size: shards may differ
    scratch = kept.get(n_items)
    if scratch is None or scratch.shape[0] < slots:
        scratch = kept[n_items] = np.zeros((slots, n_items), np.int32)
    return scratch[:slots]


@dataclass(frozen=True)
class LSHQuery:
    """How a serving top-k probes the tables: the best ``k`` of the neurons found in
    the first ``tables`` tables (0: all), scoring at most ``candidates`` of them, those
    found in the most tables (0: all found), in each shard. Fewer tables or candidates:
    faster, lower recall."""

    k: int
    tables: int = 0
    candidates: int = 0

    def __post_init__(self) -> None:
        for name, lo in (("k", 1), ("tables", 0), ("candidates", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


class LSHIndex:
    """L hash tables of ``2**range_pow`` fixed-capacity buckets over ``n_items`` vectors
    (``range_pow`` from the config, or chosen for ``n_items``).

    Queries and items are hashed with the same functions (SimHash or DWTA), redrawn by
    :meth:`draw`. :meth:`rebuild` empties the tables and inserts every item again.
    """

    def __init__(self, dim: int, cfg: SlideConfig, seed: int, n_items: int) -> None:
        self.dim = dim
        self.cfg = cfg
        self.range_pow = cfg.buckets_pow(n_items)
        n_buckets = 1 << self.range_pow
        self.ids = np.zeros((cfg.L, n_buckets, cfg.bucket_capacity), np.int32)
        self.counts = np.zeros((cfg.L, n_buckets), np.int32)
        self.policy = tables.FIFO if cfg.bucket_policy == "fifo" else tables.RESERVOIR
        self.n_draws = 0
        self.draw(seed)

    def draw(self, seed: int) -> None:
        """Draw new hash functions (the tables must be rebuilt afterwards)."""
        cfg = self.cfg
        self.seed = seed
        rng = np.random.default_rng(seed)
        n_hashes = cfg.K * cfg.L
        if cfg.hash_family == "simhash":
            signs = rng.choice(np.array([-1.0, 1.0], np.float32), size=(self.dim, n_hashes))
            keep = rng.random((self.dim, n_hashes)) < cfg.simhash_density
            self.projection = np.ascontiguousarray(signs * keep, dtype=np.float32)
        else:
            self.bins = np.stack(
                [rng.choice(self.dim, cfg.bin_size, replace=False) for _ in range(n_hashes)]
            ).astype(np.int32)
        self.n_draws += 1

    def buckets(self, vectors: np.ndarray) -> np.ndarray:
        """Bucket ids ``[n, L]`` of float32 vectors ``[n, dim]``."""
        cfg = self.cfg
        if cfg.hash_family == "simhash":
            return hashing.simhash_buckets(vectors @ self.projection, cfg.K, cfg.L, self.range_pow)
        return hashing.dwta_buckets(vectors, self.bins, cfg.K, cfg.L, self.range_pow, cfg.code_bits)

    def rebuild(self, vectors: np.ndarray) -> None:
        """Empty the tables and insert every row of ``vectors`` (row i is item i)."""
        tables.clear(self.counts)
        for start in range(0, vectors.shape[0], _BLOCK):
            block = vectors[start : start + _BLOCK]
            items = np.arange(start, start + block.shape[0], dtype=np.int32)
            tables.insert(
                self.ids, self.counts, self.buckets(block), items, self.policy, self.seed + start
            )

    def search(
        self, vectors: np.ndarray, W: np.ndarray, bias: np.ndarray, query: LSHQuery
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Serving top-k of ``vectors @ W.T + bias`` over the rows the tables retrieve
        (see :func:`~dslide_dask.kernels.topk.lsh_topk`): ``(local ids, scores,
        candidates scored per vector)``. Inference only: the tables are read, not changed."""
        n_tables = min(query.tables or self.cfg.L, self.cfg.L)
        return topk.lsh_topk(
            np.ascontiguousarray(vectors, np.float32),
            W,
            bias,
            self.buckets(vectors),
            self.ids,
            self.counts,
            n_tables,
            query.candidates,
            query.k,
            seen_scratch(len(vectors), W.shape[0]),
        )

    def occupancy(self) -> dict[str, float]:
        """Mean and max bucket fill, and the fraction of buckets that overflowed."""
        fill = np.minimum(self.counts, self.cfg.bucket_capacity)
        return {
            "mean_fill": float(fill.mean()),
            "max_offered": int(self.counts.max()),
            "overflowed": float((self.counts > self.cfg.bucket_capacity).mean()),
        }


class MIPSIndex:
    """Serving tables for the largest logits ``h @ w + b``: SimHash over the rows of a
    weight matrix under the asymmetric transform that turns inner products into cosines
    (Neyshabur & Srebro, 2015): item ``[v, b, sqrt(M^2 - |v|^2 - b^2)] / M``, query
    ``[h, 1, 0]``. Training's tables hash raw rows to sample neurons; these aim at the
    best ones. Inference only.

    ``v = w - mean(w)``: trained rows share a large common direction, which would put
    most rows in a few buckets; it shifts every logit of a query equally, so the ranking
    is the same. Rows are split into ``ranges`` by norm, each range its own tables with
    its own ``M`` (norm-ranging, Yan et al. 2018): with one ``M`` the few long rows make
    every other row's last coordinate dominate, and the buckets collapse again.
    """

    def __init__(
        self, W: np.ndarray, bias: np.ndarray, cfg: SlideConfig, seed: int, ranges: int = 4
    ) -> None:
        cfg = replace(cfg, hash_family="simhash")
        self.cfg = cfg
        n = W.shape[0]
        self.mean = W.mean(axis=0, dtype=np.float64).astype(np.float32)
        sq = np.empty(n, np.float64)
        for start in range(0, n, _BLOCK):
            v = W[start : start + _BLOCK] - self.mean
            sq[start : start + _BLOCK] = np.einsum("ij,ij->i", v, v)
        sq += bias.astype(np.float64) ** 2
        order = np.argsort(sq, kind="stable")
        groups = [g for g in np.array_split(order, max(1, min(ranges, n))) if len(g)]
        self.ranges = []
        for r, rows in enumerate(groups):
            rows = np.sort(rows).astype(np.int32)
            index = LSHIndex(W.shape[1] + 2, cfg, seed + 7919 * r, len(rows))
            M = float(np.sqrt(sq[rows].max())) or 1.0
            tables.clear(index.counts)
            for start in range(0, len(rows), _BLOCK):
                ids = rows[start : start + _BLOCK]
                rest = np.sqrt(np.maximum(M**2 - sq[ids], 0.0))
                items = np.hstack([W[ids] - self.mean, bias[ids, None], rest[:, None]]) / M
                buckets = index.buckets(items.astype(np.float32))
                tables.insert(index.ids, index.counts, buckets, ids, index.policy, seed + start)
            self.ranges.append(index)
        self.range_pow = self.ranges[0].range_pow

    def search(
        self, vectors: np.ndarray, W: np.ndarray, bias: np.ndarray, query: LSHQuery
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`LSHIndex.search` (``query.candidates`` shared by the ranges)."""
        h = np.ascontiguousarray(vectors, np.float32)
        n = len(h)
        keys = np.hstack([h, np.ones((n, 1), np.float32), np.zeros((n, 1), np.float32)])
        n_tables = min(query.tables or self.cfg.L, self.cfg.L)
        cap = -(-query.candidates // len(self.ranges)) if query.candidates else 0
        parts, scored = [], np.zeros(n, np.int64)
        for index in self.ranges:
            ids, scores, n_scored = topk.lsh_topk(
                h,
                W,
                bias,
                index.buckets(keys),
                index.ids,
                index.counts,
                n_tables,
                cap,
                query.k,
                seen_scratch(n, W.shape[0]),
            )
            parts.append((ids, scores))
            scored += n_scored
        if len(parts) == 1:
            return (*parts[0], scored)
        ids = np.concatenate([p[0] for p in parts], axis=1)
        scores = np.concatenate([p[1] for p in parts], axis=1)
        best = np.argsort(-scores, axis=1, kind="stable")[:, : query.k]
        return np.take_along_axis(ids, best, 1), np.take_along_axis(scores, best, 1), scored

    def occupancy(self) -> dict[str, float]:
        """:meth:`LSHIndex.occupancy` of each norm range's tables."""
        return {
            f"range{r}.{k}": v for r, t in enumerate(self.ranges) for k, v in t.occupancy().items()
        }


class RebuildSchedule:
    """When to rehash: every N0 steps, or at intervals ``N0 * exp(growth * k)`` growing
    with the number k of rebuilds so far; hash functions are redrawn every
    ``redraw_every`` steps (0: never). ``every`` 0: never either (training without
    tables)."""

    def __init__(self, every: int, growth: float = 0.0, redraw_every: int = 0) -> None:
        self.every = every
        self.growth = growth
        self.redraw_every = redraw_every
        self.n_rebuilds = 0
        self.next_rebuild = every
        self.next_redraw: int | None = redraw_every or None

    def due(self, step: int) -> tuple[bool, bool]:
        """``(rebuild, redraw)`` after update number ``step``; advances the schedule."""
        if self.every == 0:
            return False, False
        redraw = False
        if self.next_redraw is not None and step >= self.next_redraw:
            redraw = True
            self.next_redraw += self.redraw_every
        rebuild = redraw or step >= self.next_rebuild
        if rebuild:
            self.n_rebuilds += 1
            interval = self.every * math.exp(self.growth * self.n_rebuilds)
            self.next_rebuild = step + max(1, round(interval))
        return rebuild, redraw

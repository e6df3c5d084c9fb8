"""An index over a trained output layer: a row's best labels without scoring every label.

Scoring every label costs a pass over the whole layer a query (670K x 128 floats: 17 ms
on one core). The index answers in a fraction of a millisecond with the same labels in
all but a few rows in ten thousand (``docs/serving.md``: how it was chosen, against
which libraries, and measured): faiss's inverted file with half-precision codes
(IVF-fp16) finds ``candidates`` rows, the ``head`` rows of the largest norm join them,
and their scores are then computed exactly from the model's own float32 rows, so every
label returned carries the logit the exact top-k gives it.

Maximum inner product, ``h @ w + b``, is not a distance. Two steps make it one, with the
same ranking: the mean row is subtracted (every score of a query moves by the same
amount), and each row ``a = (w, b) - mean`` gets one more coordinate ``sqrt(M^2 - |a|^2)``
(``M``: the largest ``|a|``) that puts every row on one sphere; then the rows nearest
(in L2) to the query ``(h, 1, 0)`` are those of the largest ``h @ w + b``. Vectors are
padded with zeros to a multiple of 16, where faiss's SIMD scanners work.

One index covers the whole layer, keyed by global label ids, so it does not depend on
how the layer is sharded: :meth:`OutputIndex.attach` gives each shard the part holding
its rows (:class:`ShardIndex`), whatever the shard count the model was loaded with.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numba
import numpy as np

from dslide_dask.data.csr import SCORE_ROWS, row_ranges
from dslide_dask.kernels.rescore import rescore_topk
from dslide_dask.model.config import check_int
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.lsh_index import LSHQuery
from dslide_dask.model.wide_shard import merge_topk_scores

INSTALL = 'the output index needs faiss: pip install "dslide-dask[serve]"'
#: Scalar codes a row is stored as (the candidates are re-scored from float32 rows).
CODES = ("sq8", "fp16", "flat")
_SCALAR = {"sq8": "QT_8bit", "fp16": "QT_fp16"}  # faiss's names of the scalar codes
#: Rows per inverted list when ``lists`` is left to the index (a power of two near it).
ROWS_PER_LIST = 640
#: Fewest lists a query probes when ``probes`` is left to the index.
PROBES_MIN = 8
#: Rows of the layer transformed and added at a time (bounds the build's extra memory).
ADD_BLOCK = 1 << 16
_PAD = 16


def faiss_module():
    """faiss, or an ImportError saying how to install it."""
    try:
        import faiss
    except ImportError:
        raise ImportError(INSTALL) from None
    return faiss


@dataclass(frozen=True)
class IndexSettings:
    """How the index is built and searched (0: chosen for the layer's size).

    ``lists``: inverted lists (k-means cells), ``probes``: lists a query scans,
    ``candidates``: rows re-scored exactly a query (at least ``k``), ``head``: rows scored
    for every query besides, the largest and the most frequent labels' (:func:`head_rows`:
    the labels a trained model puts first for most rows; a cell's centre, the mean of
    mostly other rows, can rank their cell low: at 670K labels 90% of a well-trained
    network's exact top 5 are among the 316 largest rows; a briefly trained one's among
    its most frequent labels, whose 512 in the head of 1,024 give it its P@1 back: 0.2025
    with 128, 0.2315 against 0.2320 exact), ``codes``: how the lists store rows (``sq8``: a byte a
    coordinate; ``fp16``; ``flat``: float32), ``train_per_list`` / ``iterations``:
    k-means' sample and rounds, ``seed``, and ``threads`` the build uses (0: every core)."""

    lists: int = 0
    probes: int = 0
    candidates: int = 100
    head: int = 1024
    codes: str = "fp16"
    train_per_list: int = 40
    iterations: int = 10
    seed: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        for name, low, high in (
            ("lists", 0, 1 << 20),
            ("probes", 0, 1 << 20),
            ("candidates", 1, 1 << 16),
            ("head", 0, 1 << 16),
            ("train_per_list", 1, 1 << 12),
            ("iterations", 1, 1000),
            ("seed", 0, (1 << 31) - 1),
            ("threads", 0, 1 << 10),
        ):
            check_int(f"index setting {name!r}", getattr(self, name), low, high)
        if self.codes not in CODES:
            raise ValueError(f"index setting 'codes' must be one of {CODES}, got {self.codes!r}")

    @classmethod
    def of(cls, settings: dict) -> IndexSettings:
        """Settings from a mapping; a ValueError names a key that is not a setting."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in names:
                raise ValueError(f"index setting {key!r}: not one of {', '.join(names)}")
        return cls(**settings)

    def for_rows(self, n_rows: int) -> IndexSettings:
        """These settings with ``lists`` and ``probes`` chosen for ``n_rows`` rows where
        left at 0: a power of two near ``n_rows / 640`` lists, and a list in 128 probed,
        at least 8 (670K labels: 1,024 lists, 8 probed, 0.8% of the rows scanned; with
        the head rows, recall@5 1.000 on a one-epoch model, ``docs/serving.md``)."""
        lists = self.lists or int(
            2 ** np.clip(round(np.log2(max(n_rows, 1) / ROWS_PER_LIST)), 0, 16)
        )
        lists = min(lists, max(n_rows, 1))
        probes = min(self.probes or max(PROBES_MIN, lists // 128), lists)
        return dataclasses.replace(self, lists=lists, probes=probes)


def padded_dim(dim: int) -> int:
    """The index's vector width for a layer of input ``dim``: ``dim`` + bias + the
    sphere coordinate, padded to a multiple of 16."""
    return -(-(dim + 2) // _PAD) * _PAD


def _rows(shard, local: np.ndarray, mean: np.ndarray, max_sq: float, width: int) -> np.ndarray:
    """Rows ``local`` of a shard as index vectors: centred, on the sphere, padded."""
    a = np.zeros((len(local), width), np.float64)
    dim = shard.dim_in
    a[:, :dim] = shard.W[local]
    a[:, dim] = shard.bias[local]
    a[:, : dim + 1] -= mean
    sq = np.einsum("ij,ij->i", a[:, : dim + 1], a[:, : dim + 1])
    a[:, dim + 1] = np.sqrt(np.maximum(max_sq - sq, 0.0))
    return a.astype(np.float32)


def _sphere(shards) -> tuple[np.ndarray, np.ndarray]:
    """The mean row ``(w, b)`` of the layer, and every row's squared norm once centred
    (by global label id)."""
    total = sum(
        np.hstack([s.W.sum(0, dtype=np.float64), s.bias.sum(dtype=np.float64)]) for s in shards
    )
    mean = total / shards[0].layout.n_neurons
    sq = np.empty(shards[0].layout.n_neurons)
    for s in shards:
        for start in range(0, s.n_local, ADD_BLOCK):
            rows = np.arange(start, min(start + ADD_BLOCK, s.n_local))
            block = np.hstack([s.W[rows], s.bias[rows, None]]) - mean
            sq[s.global_ids(rows)] = np.einsum("ij,ij->i", block, block)
    return mean, sq


def head_rows(sq: np.ndarray, counts: np.ndarray | None, n_head: int) -> np.ndarray:
    """The ``n_head`` rows every query scores, sorted: those of the largest squared norm
    ``sq`` once centred, and with the labels' training ``counts``, the most frequent
    labels in turns with them. A network trained briefly against a few random negatives
    (the default where labels are mostly rare) keeps rows of nearly one norm, so the
    norm names none of its best labels; they are its most frequent ones (amazon-670k:
    the exact top 5 of 500 test rows are 102 labels, all among the 1,024 most frequent;
    recall@5 through the index 0.27 with the head by norm alone, docs/serving.md)."""
    by_norm = np.argsort(-sq, kind="stable")
    if counts is None or len(counts) != len(sq) or not np.any(counts):
        return np.sort(by_norm[:n_head])
    by_count = np.argsort(-np.asarray(counts), kind="stable")
    turns = np.column_stack([by_norm[:n_head], by_count[:n_head]]).ravel()
    _, first = np.unique(turns, return_index=True)
    return np.sort(turns[np.sort(first)[:n_head]])


def new_ivf(width: int, settings: IndexSettings):
    """An empty faiss inverted file (L2) of ``width``-wide vectors, as ``settings`` say:
    ``lists`` cells, rows stored as ``codes``, k-means' rounds and seed."""
    faiss = faiss_module()
    quantizer = faiss.IndexFlatL2(width)
    if settings.codes == "flat":
        index = faiss.IndexIVFFlat(quantizer, width, settings.lists, faiss.METRIC_L2)
    else:
        kind = getattr(faiss.ScalarQuantizer, _SCALAR[settings.codes])
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, width, settings.lists, kind, faiss.METRIC_L2
        )
    index.cp.niter, index.cp.seed = settings.iterations, settings.seed
    index.cp.min_points_per_centroid = 1  # a few rows a list is what small layers have
    return index


class FaissThreads:
    """faiss's OpenMP threads for a block of work in this thread, then as they were."""

    def __init__(self, n: int) -> None:
        self.faiss, self.n = faiss_module(), n

    def __enter__(self) -> None:
        self.before = self.faiss.omp_get_max_threads()
        self.faiss.omp_set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        self.faiss.omp_set_num_threads(self.before)


class OutputIndex:
    """A faiss IVF index over every row of an output layer, by global label id, with
    the settings it was built with."""

    def __init__(
        self, index, settings: IndexSettings, n_labels: int, dim: int, head: np.ndarray
    ) -> None:
        self.index, self.settings, self.head = index, settings, head
        self.n_labels, self.dim = n_labels, dim
        self._parts: dict[tuple, ShardIndex] = {}

    def __getstate__(self) -> dict:
        return {**vars(self), "_parts": {}}  # the parts are copies: made again on demand

    @classmethod
    def build(
        cls, shards, settings: IndexSettings | None = None, counts: np.ndarray | None = None
    ) -> OutputIndex:
        """The index of the output layer held by ``shards`` (every shard of one layer);
        ``counts``, each label's training rows if known, choose half the head rows."""
        layout: ShardLayout = shards[0].layout
        n, dim = layout.n_neurons, shards[0].dim_in
        settings = (settings or IndexSettings()).for_rows(n)
        width = padded_dim(dim)
        mean, sq = _sphere(shards)
        max_sq = float(sq.max())
        head = head_rows(sq, counts, min(settings.head, n))
        rng = np.random.default_rng(settings.seed)
        sample = np.sort(
            rng.choice(n, min(n, settings.lists * settings.train_per_list), replace=False)
        )
        owners, local = layout.owner(sample), layout.to_local(sample)
        train = np.concatenate(
            [_rows(s, local[owners == i], mean, max_sq, width) for i, s in enumerate(shards)]
        )
        index = new_ivf(width, settings)
        with FaissThreads(settings.threads or os.cpu_count() or 1):
            index.train(train)
            for s in shards:
                for start in range(0, s.n_local, ADD_BLOCK):
                    rows = np.arange(start, min(start + ADD_BLOCK, s.n_local))
                    index.add_with_ids(_rows(s, rows, mean, max_sq, width), s.global_ids(rows))
        return cls(index, settings, n, dim, head)

    def with_probes(self, probes: int) -> OutputIndex:
        """The same index (its lists shared) searched with ``probes`` lists a query."""
        settings = dataclasses.replace(self.settings, probes=probes)
        return OutputIndex(self.index, settings, self.n_labels, self.dim, self.head)

    @property
    def nbytes(self) -> int:
        """Bytes of the index as stored."""
        return int(self.to_bytes().nbytes)

    def to_bytes(self) -> np.ndarray:
        """faiss's own serialisation (uint8), read back by :meth:`from_bytes`."""
        return faiss_module().serialize_index(self.index)

    @classmethod
    def from_bytes(
        cls, blob: np.ndarray, head: np.ndarray, settings: IndexSettings, n_labels: int, dim: int
    ) -> OutputIndex:
        """The index :meth:`to_bytes` wrote, and its ``head`` rows; a ValueError when it is
        not an index of ``n_labels`` rows of width ``dim`` holding each label once."""
        head = np.asarray(head)
        if (
            head.dtype != np.int64
            or head.ndim != 1
            or len(head) != min(settings.head, n_labels)
            or (len(head) and not (head[0] >= 0 and head[-1] < n_labels))
            or (np.diff(head) <= 0).any()
        ):
            raise ValueError(f"head must be {min(settings.head, n_labels)} sorted label ids")
        faiss = faiss_module()
        try:
            index = faiss.deserialize_index(np.ascontiguousarray(blob, np.uint8))
        except RuntimeError as err:
            raise ValueError(f"not a faiss index ({str(err).splitlines()[0]})") from None
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is None or index.d != padded_dim(dim) or index.ntotal != n_labels:
            raise ValueError(f"not an index of {n_labels} rows of width {dim}")
        lists = ivf.invlists
        parts = [
            faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
            for i in range(ivf.nlist)
            if lists.list_size(i)
        ]
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if (
            len(ids) != n_labels
            or (np.bincount(np.clip(ids, 0, n_labels), minlength=n_labels)[:n_labels] != 1).any()
        ):
            raise ValueError("its ids are not every label once")
        return cls(index, settings, n_labels, dim, head)

    def attach(self, shards) -> None:
        """Give every shard the part of the index over its rows (``serving_index``:
        what the serving top-k, :meth:`~dslide_dask.model.wide_shard.WideShard.topk`
        with a query, searches)."""
        for shard in shards:
            shard.serving_index = self.for_shard(shard.layout, shard.shard_index)

    def for_shard(self, layout: ShardLayout, shard: int) -> ShardIndex:
        """The part of the index over the rows ``shard`` owns under ``layout`` (made
        once: the lists' entries of those labels copied)."""
        if layout.n_neurons != self.n_labels:
            raise ValueError(f"the index has {self.n_labels} labels, the layout {layout.n_neurons}")
        key = (layout, shard)
        if key not in self._parts:
            head = self.head[layout.owner(self.head) == shard]
            part = self._subset(layout, shard)
            self._parts[key] = ShardIndex(part, layout, self.settings, layout.to_local(head))
        return self._parts[key]

    def _subset(self, layout: ShardLayout, shard: int):
        if layout.n_shards == 1:
            return self.index
        faiss = faiss_module()
        part = faiss.clone_index(faiss.extract_index_ivf(self.index))
        part.reset()
        period = len(layout.pattern)
        for slot in np.flatnonzero(np.asarray(layout.pattern) == shard):
            self.index.copy_subset_to(
                part, faiss.InvertedLists.SUBSET_TYPE_ID_MOD, period, int(slot)
            )
        return part

    def topk_scores(self, net, X, k: int, batch_size: int = SCORE_ROWS):
        """Top-k label ids of the rows ``X`` by the network ``net`` (the layer this index
        was built from, any sharding) and their exact logits, -inf where fewer were found:
        :meth:`~dslide_dask.model.network.SlideNetwork.topk_scores` through the index."""
        ids = np.empty((X.n_rows, k), np.int64)
        scores = np.empty((X.n_rows, k), np.float32)
        query = LSHQuery(k)
        for start, stop in row_ranges(X.n_rows, batch_size):
            h, _ = net.hidden.forward(X.slice_rows(start, stop))
            parts = []
            for shard in net.shards:
                local, found, _ = self.for_shard(shard.layout, shard.shard_index).search(
                    h, shard.W, shard.bias, query
                )
                parts.append(
                    (np.where(local >= 0, shard.global_ids(np.maximum(local, 0)), -1), found)
                )
            ids[start:stop], scores[start:stop] = (
                parts[0] if len(parts) == 1 else merge_topk_scores(parts, k)
            )
        return ids, scores


class ShardIndex:
    """The index of one shard's rows: :meth:`search` as
    :meth:`~dslide_dask.model.lsh_index.LSHIndex.search`, so every serving top-k path
    (prediction graphs, ``dslide bench topk``) takes it in place of LSH tables."""

    def __init__(
        self, index, layout: ShardLayout, settings: IndexSettings, head: np.ndarray
    ) -> None:
        self.index, self.layout, self.settings = index, layout, settings
        self.head = head  # local ids of the shard's head rows, scored for every query

    def candidates(self, h: np.ndarray, m: int) -> np.ndarray:
        """Global ids of the ``m`` rows each query's probed lists hold nearest (-1:
        fewer); faiss on as many threads as numba has here (one knob for both)."""
        faiss = faiss_module()
        n, dim = h.shape
        q = np.zeros((n, self.index.d), np.float32)
        q[:, :dim] = h
        q[:, dim] = 1.0
        params = faiss.SearchParametersIVF(nprobe=self.settings.probes)
        with FaissThreads(numba.get_num_threads()):
            return self.index.search(q, m, params=params)[1]

    def search(self, vectors: np.ndarray, W: np.ndarray, bias: np.ndarray, query: LSHQuery):
        """The best ``query.k`` of each row's candidates (``query.candidates`` of them, 0:
        the settings'), scored exactly: ``(local ids, scores, candidates scored)``."""
        h = np.ascontiguousarray(vectors, np.float32)
        found = self.candidates(h, max(query.candidates or self.settings.candidates, query.k))
        local = np.where(found >= 0, self.layout.to_local(np.maximum(found, 0)), -1)
        if len(self.head):
            local = np.hstack([np.broadcast_to(self.head, (len(h), len(self.head))), local])
        ids, scores = rescore_topk(h, W, bias, local, query.k)
        return ids, scores, (local >= 0).sum(axis=1)

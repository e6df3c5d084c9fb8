"""What a prediction task needs to know, as one frozen, picklable value."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from dslide_dask.model.lsh_index import LSHQuery

#: The most candidates an output index re-scores a row (its ``IndexSettings.candidates``
#: bound): a row's candidates are held as dense ``[rows, candidates]`` arrays.
MAX_INDEX_CANDIDATES = 1 << 16


@dataclass(frozen=True)
class PredictSpec:
    """Which model (a resolved checkpoint URL: workers cache the model under it), how
    many labels per row, and how to find them: ``exact`` scores every label; otherwise
    ``tables``/``candidates`` of :class:`~dslide_dask.model.lsh_index.LSHQuery`.
    ``storage_options`` reach the model and the output. Keyword arguments after the URL."""

    model_url: str
    _: KW_ONLY
    k: int = 5
    exact: bool = True
    tables: int = 0
    candidates: int = 0
    storage_options: dict = field(default_factory=dict)
    #: serving tables built when a worker loads the model (see
    #: :func:`~dslide_dask.inference.serving.reindex`): the MIPS transform, and
    #: ``(name, value)`` config overrides such as ``(("L", 100),)``; empty: training's
    mips: bool = False
    index: tuple = ()
    #: answer through the model's stored output index (``dslide index``) instead of LSH
    #: tables: its candidates (``candidates``, 0: as built), scored exactly
    output_index: bool = False
    #: answer with the model's fused parts (neighbours, centroids, label trees) where it
    #: has them, the network's candidates found as above; False: the network alone
    fused: bool = True

    def __post_init__(self) -> None:
        self.query()  # checks k, tables, candidates
        if self.output_index and (self.exact or self.mips or self.index):
            raise ValueError(
                "output_index answers in place of the exact top-k and of LSH tables: "
                "exact=False, and no mips or table settings"
            )
        if self.output_index and self.candidates > MAX_INDEX_CANDIDATES:
            raise ValueError(
                f"candidates must be in [0, {MAX_INDEX_CANDIDATES}] with output_index (0: as "
                f"the index was built), got {self.candidates}"
            )
        object.__setattr__(self, "index", tuple(sorted(dict(self.index).items())))

    def query(self) -> LSHQuery:
        return LSHQuery(self.k, self.tables, self.candidates)


@dataclass(frozen=True)
class LeftOut:
    """Pairs of a row and a label left out of its answers, as a prediction graph's tasks
    drop them: ``pairs`` (a :class:`~dslide_dask.data.label_pairs.LabelPairs`, or a
    future of one scattered to the cluster), the ``k`` answers a row keeps, and the pairs'
    URL, masked, for the manifest."""

    pairs: Any
    k: int
    url: str

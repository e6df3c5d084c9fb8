"""What a prediction task needs to know, as one frozen, picklable value."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from dslide_dask.model.lsh_index import LSHQuery


@dataclass(frozen=True)
class PredictSpec:
    """Which model (a resolved checkpoint URL: workers cache the model under it), how
    many labels per row, and how to find them: ``exact`` scores every label; otherwise
    ``tables``/``candidates`` of :class:`~dslide_dask.model.lsh_index.LSHQuery`.
    ``storage_options`` reach the model and the output."""

    model_url: str
    _: KW_ONLY
    k: int = 5
    exact: bool = True
    tables: int = 0
    candidates: int = 0
    storage_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.query()  # checks k, tables, candidates

    def query(self) -> LSHQuery:
        return LSHQuery(self.k, self.tables, self.candidates)

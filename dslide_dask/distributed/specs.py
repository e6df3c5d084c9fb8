"""What the client sends to build each actor: one frozen, picklable spec per boundary.

An actor's constructor runs on a worker from arguments pickled on the client; fields
named in a spec cannot be silently mis-bound there the way a long positional list can.
"""

from __future__ import annotations

from dataclasses import dataclass

from dslide_dask.checkpoint import CheckpointPolicy
from dslide_dask.distributed.moves.handover import Handover
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.layout import ShardLayout

#: How training steps run: actor calls (fast), or task graphs the dashboard shows.
STEP_MODES = ("actor", "graph")


@dataclass(frozen=True)
class ShardSpec:
    """One shard of the wide layer: which rows, how to compute and ship them."""

    cfg: SlideConfig
    dim_in: int  #: width of the last hidden layer
    layout: ShardLayout
    shard_index: int
    n_threads: int  #: numba threads on the shard's worker
    wire_dtype: str  #: dtype of activations and gradients on the wire
    restore: str | None = None  #: a checkpoint URL to load the rows from
    storage_options: dict | None = None
    model_id: str = ""  #: names the model's parts for graph-mode tasks
    answering: bool = False  #: restored without the optimiser state, to answer only
    handover: Handover | None = None  #: take the rows from a live model's shards
    n_features: int = 0  #: width of the input, for a slice of the hidden layer
    hidden_units: tuple[int, int] | None = None  #: the hidden layer's units held here


@dataclass(frozen=True)
class CoordinatorSpec:
    """The coordinator of one model: its hidden layers and how it drives the shards."""

    cfg: SlideConfig
    n_features: int
    n_labels: int
    layout: ShardLayout
    shard_workers: tuple[str, ...]  #: the worker of each shard, in shard order
    n_threads: int
    wire_dtype: str
    pipeline: bool  #: overlap the shards' step t+1 with the hidden layers' update of t
    local_shard: ShardSpec  #: shard 0, which the coordinator holds itself
    checkpoint: CheckpointPolicy | None = None
    restore: str | None = None
    storage_options: dict | None = None
    answering: bool = False  #: restored without the optimiser state, to answer only
    run_name: str = "default"  #: the run's name on the dashboard
    step_mode: str = "actor"  #: "graph": each step as tasks named by phase, for profiling
    model_id: str = ""  #: names the model's parts for graph-mode tasks
    #: the hidden layer's units on each of the first shards (empty: all here)
    hidden_units: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.step_mode not in STEP_MODES:
            raise ValueError(f"step_mode must be one of {list(STEP_MODES)}, got {self.step_mode!r}")
        if self.hidden_units and self.step_mode != "actor":
            raise ValueError("a hidden layer split over workers needs step_mode='actor'")

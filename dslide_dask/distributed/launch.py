"""Building a model on the cluster for :class:`~.trainer.DistributedTrainer`: which workers
it may use, where its shards go (:func:`~.placement.place_shards`), and its actors
submitted (fresh, restored from a checkpoint, or taking over a live model's parts) and
then trained with.

Apart from the trainer's training and query calls because a model is built at the start,
after a lost worker (:mod:`.recovery`) and for every move
(:mod:`~dslide_dask.distributed.moves`), each time the same way.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dslide_dask.distributed.coordinator import Coordinator
from dslide_dask.distributed.liveness import workers_now
from dslide_dask.distributed.moves.handover import Handover, HandoverPieces
from dslide_dask.distributed.placement import Placement, place_shards
from dslide_dask.distributed.shard_actor import ShardActor
from dslide_dask.distributed.specs import CoordinatorSpec, ShardSpec
from dslide_dask.model.fused_size import FusedBytes

if TYPE_CHECKING:
    from distributed import Client

    from dslide_dask.checkpoint import CheckpointPolicy
    from dslide_dask.model.config import SlideConfig


@dataclass(frozen=True)
class Launch:
    """A model's actors submitted on a placement, perhaps still being built."""

    placement: Placement
    token: str  #: the model's id
    unused: frozenset[str]  #: the workers there were that it does not use
    futures: tuple  #: the coordinator's actor future, then the other shards'


class LaunchesModels:
    """The models of :class:`~.trainer.DistributedTrainer`, placed and launched.

    :meth:`_adopt` sets the model in use (``placement``, ``coordinator``, ``_futures``,
    ``_model_id``, ``_unused``); what it uses of the trainer and its other parts is
    declared below."""

    # set by the host, the trainer: its settings
    client: Client
    cfg: SlideConfig
    n_features: int
    n_labels: int
    n_shards_asked: int | None
    hidden_shards: int | None
    wire_dtype: str
    pipeline: bool
    step_mode: str
    coordinator_load: float
    policy: CheckpointPolicy | None
    storage_options: dict | None
    answering: bool  #: restored without the optimiser state, to answer only
    name: str
    # set by the moves (FollowsTheCluster)
    _left: set[str]  #: workers asked to leave whose rows went elsewhere
    _unfit: frozenset[str]  #: workers a new model could not be built on
    # the model in use, set here by _adopt
    placement: Placement
    coordinator: Any  #: the coordinator actor's handle (None once released)
    _futures: list  #: the actors of the model in use
    _model_id: str
    _unused: frozenset[str]  #: the workers there were that it does not use
    fused_bytes: FusedBytes  #: kept free for the fused parts

    if TYPE_CHECKING:

        def _wait(self, future: Any) -> Any: ...

    def _workers(self) -> dict[str, dict]:
        """The scheduler's view of the workers the model may use: not those that left, nor
        those a model could not be built on."""
        workers = workers_now(self.client)
        return {a: w for a, w in workers.items() if a not in self._left | self._unfit}

    def _place(self, workers: dict[str, dict], previous: Placement | None = None) -> Placement:
        n_shards = self.n_shards_asked
        if n_shards is not None:
            n_shards = min(n_shards, len(workers))
        return place_shards(
            workers,
            self.cfg,
            self.n_labels,
            n_shards,
            coordinator_load=self.coordinator_load,
            n_features=self.n_features,
            previous=previous,
            hidden_shards=self.hidden_shards,
            fused_bytes=self.fused_bytes,
            answering=self.answering,
        )

    def _start(
        self,
        restore: str | None,
        placement: Placement | None = None,
        handover: Handover | None = None,
    ) -> None:
        """Place (unless given a placement) and start the actors: fresh, restored from a
        checkpoint URL, or taking over a live model's parts (:mod:`.moves.handover`)."""
        self._adopt(self._launch(restore, placement or self._place(self._workers()), handover))

    def _launch(
        self, restore: str | None, placement: Placement, handover: Handover | None = None
    ) -> Launch:
        """Submit a model's actors on ``placement`` without waiting for them."""
        client, cfg = self.client, self.cfg
        workers = self._workers()
        token = uuid.uuid4().hex[:8]
        threads = [int(workers[w].get("nthreads", 1)) for w in placement.workers]
        layout = placement.layout
        units = placement.hidden_units
        pieces = HandoverPieces(client, handover, placement, token)

        def shard(s: int) -> ShardSpec:
            return ShardSpec(
                cfg=cfg,
                dim_in=cfg.hidden[-1],
                layout=layout,
                shard_index=s,
                n_threads=threads[s],
                wire_dtype=self.wire_dtype,
                restore=restore,
                storage_options=self.storage_options,
                model_id=token,
                answering=self.answering,
                handover=handover,
                n_features=self.n_features,
                hidden_units=units[s] if s < len(units) else None,
            )

        spec = CoordinatorSpec(
            cfg=cfg,
            n_features=self.n_features,
            n_labels=self.n_labels,
            layout=layout,
            shard_workers=tuple(placement.workers),
            n_threads=threads[0],
            wire_dtype=self.wire_dtype,
            pipeline=self.pipeline,
            local_shard=shard(0),
            checkpoint=self.policy,
            restore=restore,
            storage_options=self.storage_options,
            answering=self.answering,
            run_name=self.name,
            step_mode=self.step_mode,
            model_id=token,
            hidden_units=units,
        )
        # the coordinator (with shard 0) and the other shards are built side by side
        coordinator = client.submit(
            Coordinator,
            spec,
            *pieces.coordinator(),
            actor=True,
            workers=[placement.workers[0]],
            allow_other_workers=False,
            key=f"coordinator-{token}",
        )
        others = [
            client.submit(
                ShardActor,
                shard(s),
                *pieces.shard(s),
                actor=True,
                workers=[w],
                allow_other_workers=False,
                key=f"wide-shard-{s}-{token}",
            )
            for s, w in enumerate(placement.workers)
            if s > 0
        ]
        unused = frozenset(workers) - set(placement.workers)
        return Launch(placement, token, unused, (coordinator, *others))

    def _adopt(self, launch: Launch) -> None:
        """Train with the launched model from now on (once its actors stand)."""
        self.placement, self._model_id, self._unused = launch.placement, launch.token, launch.unused
        self._futures = list(launch.futures)
        coordinator, *others = launch.futures
        self.coordinator = self._wait(coordinator)
        self._wait(self.coordinator.connect([self._wait(f) for f in others]))

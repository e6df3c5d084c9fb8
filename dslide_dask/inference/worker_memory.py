"""What a worker holds to answer with a model, worked out from the checkpoint's manifests
before any task runs.

Every worker of a prediction loads the whole model it answers with (its fused parts, and
the network where they ask it). On a worker too small for it Dask pauses the worker at
80% of its memory limit (the graph then waits for ever) or its nanny restarts it at 95%
(``KilledWorker`` after a few tries); a check beforehand says why in one line instead.
"""

from __future__ import annotations

from dslide_dask.checkpoint.fused import check_fused
from dslide_dask.checkpoint.neighbours import stored_bytes
from dslide_dask.checkpoint.output_index import output_index_bytes
from dslide_dask.checkpoint.store import Checkpoint
from dslide_dask.distributed.memory_plan import BUDGET, RUNTIME_BYTES, fits
from dslide_dask.inference.spec import PredictSpec
from dslide_dask.model.neighbours import EMBEDDING
from dslide_dask.model.optimizer import is_moment

#: A worker's bytes for the fused parts, of their stored bytes: what is derived from them
#: as they load and first answer (the label centroids, the serving postings, the trees'
#: weights laid out by feature) and the answer's scratch. Measured: the `amazon-670k`
#: default model's 315 MB of parts took 502 MB after 1,024 rows through its indexes.
FUSED_SERVED = 1.6


def worker_bytes(ckpt: Checkpoint, spec: PredictSpec) -> int:
    """The bytes one worker holds to answer with checkpoint ``ckpt`` as ``spec`` says:
    the process itself, the fused parts as served, and the network (its stored arrays but
    the Adam moments, which a worker does not read; its output index with
    ``spec.output_index``) unless the fused parts never ask it."""
    need = RUNTIME_BYTES
    network = True
    fusion = check_fused(ckpt) if spec.fused else None
    if fusion is not None:
        parts = stored_bytes(ckpt.url, spec.storage_options)
        need += round(FUSED_SERVED * sum(parts.values()))
        network = fusion.asks_network(EMBEDDING in parts)
    if network:
        arrays = ckpt.meta["arrays"].items()
        need += sum(int(entry["bytes"]) for name, entry in arrays if not is_moment(name))
        if spec.output_index:
            need += output_index_bytes(ckpt)
    return need


def check_room(need: int, workers: dict[str, dict]) -> None:
    """ValueError naming the first worker (of the scheduler's ``workers``: address ->
    identity) whose memory limit leaves less than ``need`` bytes below Dask's pause."""
    for address, info in sorted(workers.items()):
        limit = int(info.get("memory_limit") or 0)
        if not fits(need, limit):
            wanted = need / BUDGET / 2**30
            raise ValueError(
                f"each worker needs about {need / 2**30:.2f} GiB to answer with this model, "
                f"and worker {address} has a memory limit of {limit / 2**30:.2f} GiB (Dask "
                f"pauses a worker at {BUDGET:.0%} of it): give the workers {wanted:.1f} GiB "
                "or more"
            )

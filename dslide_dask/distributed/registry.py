"""The model parts this worker process holds, for graph-mode tasks to find by name.

A graph-mode step (:mod:`dslide_dask.distributed.graph_step`) is a set of ordinary Dask
tasks pinned to the workers of a model's parts; a task cannot be handed a multi-gigabyte
shard as an argument, so it looks the part up here by ``(model id, part)``. Parts are held
weakly: releasing the actor frees its memory, and a later lookup says the part is gone.
One lock serialises the parts' kernels in this process, as the actor thread does in the
actor step mode (numba's parallel kernels are not re-entrant from several threads).
"""

from __future__ import annotations

import threading
import weakref

#: The coordinator's name among a model's parts (the shards go by their index).
COORDINATOR = "coordinator"
#: Held by every graph-mode task while it runs model arithmetic in this process.
KERNEL_LOCK = threading.Lock()

_PARTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def register(model_id: str, part: int | str, obj: object) -> None:
    """Make ``obj`` findable as ``part`` (a shard index, or ``"coordinator"``) of a model."""
    _PARTS[model_id, part] = obj


def lookup(model_id: str, part: int | str):
    """The object registered as ``part`` of a model in this process."""
    try:
        return _PARTS[model_id, part]
    except KeyError:
        raise LookupError(
            f"model {model_id} has no {part!r} part in this worker process: the task ran on "
            f"a worker that does not hold it, or the model was released"
        ) from None

"""The coordinator's side: one metrics record per step or evaluation, sent as a Dask event.

A record travels on the worker's batched stream to the scheduler (``log_event``): no
round trip, nothing waits for it, and a record that cannot be sent is dropped rather
than stopping training.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: The event topic records travel on.
TOPIC = "dslide-metrics"
#: The scheduler plugin's name (it collects the records; the routes find it by name).
PLUGIN_NAME = "dslide-training-metrics"
#: Run name of records that name none.
DEFAULT_RUN = "default"


def publish(target: Any, record: Mapping[str, Any], run: str | None = None) -> bool:
    """Send one metrics record to the scheduler's plugin without waiting for it.

    ``target`` is the Worker the caller runs on (``get_worker()``, an actor's worker), or a
    Client (a round trip then). ``record`` holds numbers (numpy scalars and arrays are
    fine): a step's statistics, and/or the ``"P@k"`` (``"nDCG@k"``, ``"PSP@k"``...) values
    of an evaluation with its ``"step"``, optionally ``"shard_busy"`` (busy seconds of
    each shard) and ``"run"`` (a name; default ``"default"``). Whether it was sent; never
    raises: metrics must not stop training."""
    try:
        msg = {str(k): plain(v) for k, v in record.items()}
        if run is not None:
            msg["run"] = run
        target.log_event(TOPIC, msg)
    except Exception:
        logger.debug("dslide metrics record not sent", exc_info=True)
        return False
    return True


def plain(value: Any) -> Any:
    """``value`` as the plain types a Dask event may carry (msgpack)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, np.ndarray | list | tuple):
        return [plain(v) for v in value]
    return repr(value)

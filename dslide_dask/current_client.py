"""The Dask client the caller's code runs under, as dask-ml finds it."""

from __future__ import annotations

import sys
from typing import Any


def current_client() -> Any:
    """``distributed.default_client()``, or None where there is none.

    ``distributed`` is looked up only if it was imported: without it there can be no
    client, and work in one process then never pays for importing it.
    """
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:  # no current client
        return None

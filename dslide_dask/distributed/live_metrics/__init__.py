"""Live training metrics where Dask users look: the dashboard and its Prometheus endpoint.

The coordinator calls :func:`publish` after each step and each evaluation: one
``Worker.log_event`` on the worker's batched stream to the scheduler, no round trip
(:mod:`.events`). On the scheduler, :class:`TrainingMetricsPlugin` (put there by
:func:`install`, or by ``dask scheduler --preload dslide_dask.distributed.live_metrics``)
keeps the latest values and a bounded history of every run (:mod:`.plugin`,
:mod:`.runs`), and the dashboard's web server serves them (:mod:`.routes`):

- ``/dslide``: a page plotting them, refreshed every 2 s; it is also listed in
  ``/individual-plots.json``, so JupyterLab's Dask sidebar offers it;
- ``/dslide/metrics.json``: the same data as JSON;
- ``/dslide/metrics``: Prometheus text format, with nothing extra installed;
- ``/metrics``: the scheduler's own Prometheus endpoint carries the ``dslide_*`` families
  too when ``prometheus_client`` is installed on the scheduler (:mod:`.prometheus`).

With :func:`scheduler_routes` in the scheduler's ``distributed.scheduler.http.routes``
the ``/dslide`` routes exist (empty) from the scheduler's start; otherwise from the
plugin's.
"""

from __future__ import annotations

import warnings

from distributed import Client, Scheduler

from dslide_dask.distributed.live_metrics.events import DEFAULT_RUN, PLUGIN_NAME, TOPIC, publish
from dslide_dask.distributed.live_metrics.plugin import TrainingMetricsPlugin
from dslide_dask.distributed.live_metrics.prometheus import exposition
from dslide_dask.distributed.live_metrics.routes import scheduler_routes

__all__ = [
    "DEFAULT_RUN",
    "PLUGIN_NAME",
    "TOPIC",
    "TrainingMetricsPlugin",
    "dask_setup",
    "exposition",
    "install",
    "publish",
    "scheduler_routes",
    "snapshot",
]


def install(client: Client) -> bool:
    """Put the plugin on the client's scheduler (idempotent). False, with a warning, when
    the scheduler cannot take it (e.g. dslide_dask is not installed there)."""
    try:
        client.register_plugin(TrainingMetricsPlugin())
        return True
    except Exception as error:
        warnings.warn(f"dslide live metrics are off: {error!r}", RuntimeWarning, stacklevel=2)
        return False


def snapshot(client: Client) -> dict | None:
    """What the scheduler's plugin holds (as served at ``/dslide/metrics.json``), or None
    when it is not installed."""
    return client.run_on_scheduler(_snapshot_on_scheduler)


def _snapshot_on_scheduler(dask_scheduler: Scheduler) -> dict | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin.snapshot() if isinstance(plugin, TrainingMetricsPlugin) else None


def dask_setup(scheduler: Scheduler) -> None:
    """Preload hook: ``dask scheduler --preload dslide_dask.distributed.live_metrics``."""
    scheduler.add_plugin(TrainingMetricsPlugin(), idempotent=True)

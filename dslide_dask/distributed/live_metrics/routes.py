"""The dashboard's ``/dslide`` routes: a ``distributed.scheduler.http.routes`` module.

Listed in that configuration (:func:`scheduler_routes`), the routes are there from the
moment the scheduler starts, answering with empty metrics until a run reports. A
scheduler started without them (any running cluster a client connects to) gets them
from the plugin when it starts (:func:`serve`). The handlers find the plugin by name at
each request, so they never hold stale state.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import dask.config
from distributed.http import get_handlers
from distributed.http.utils import RequestHandler
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from dslide_dask.distributed.live_metrics.events import PLUGIN_NAME
from dslide_dask.distributed.live_metrics.prometheus import exposition

#: The page's entry in the list JupyterLab's Dask sidebar offers.
SIDEBAR_ENTRY = ("Individual DSLIDE Training", "/dslide")
#: Dask's module that serves ``/individual-plots.json`` (the sidebar's list).
DASK_INFO_ROUTES = "distributed.http.scheduler.info"


def scheduler_routes(configured: list[str] | None = None) -> list[str]:
    """``distributed.scheduler.http.routes`` with these routes added, ahead of Dask's
    ``/individual-plots.json`` so that the sidebar lists the page. E.g.
    ``dask.config.set({"distributed.scheduler.http.routes": scheduler_routes()})`` before
    starting a LocalCluster, or the same list in ``DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES``
    for ``dask scheduler``."""
    if configured is None:
        configured = dask.config.get("distributed.scheduler.http.routes")
    others = [m for m in configured if m != __name__]
    at = others.index(DASK_INFO_ROUTES) if DASK_INFO_ROUTES in others else len(others)
    return [*others[:at], __name__, *others[at:]]


class _Handler(RequestHandler):
    def plugin(self) -> Any:
        return self.server.plugins.get(PLUGIN_NAME)

    def reply(self, body: str, content_type: str) -> None:
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-store")
        self.write(body)


class JSONHandler(_Handler):
    def get(self) -> None:
        plugin = self.plugin()
        data = plugin.snapshot() if plugin else {"runs": {}, "installed": False}
        self.reply(json.dumps(data), "application/json")


class PrometheusHandler(_Handler):
    def get(self) -> None:
        plugin = self.plugin()
        self.reply(exposition(plugin.families() if plugin else []), "text/plain; version=0.0.4")


class PageHandler(_Handler):
    def get(self) -> None:
        self.reply(page(), "text/html; charset=utf-8")


def page() -> str:
    """The live page (``page.html`` beside this module): it polls ``metrics.json``."""
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


def _sidebar_listing() -> type | None:
    """Dask's ``/individual-plots.json`` with the page added, or None if this distributed
    has no such handler. Dask offers no hook to extend that list, so its handler's reply
    gets the entry on the way out; the tests check Dask's own entries stay."""
    try:
        from distributed.http.scheduler.info import IndividualPlots
    except ImportError:
        return None

    class WithDslide(IndividualPlots):
        def write(self, chunk: Any) -> None:
            if isinstance(chunk, dict):
                chunk = dict([*chunk.items(), SIDEBAR_ENTRY])
            super().write(chunk)

    return WithDslide


#: ``(pattern, handler, kwargs)`` under the dashboard's prefix, as Dask's modules list them.
routes: list[tuple] = [
    (r"dslide/?", PageHandler, {}),
    (r"dslide/metrics\.json", JSONHandler, {}),
    (r"dslide/metrics", PrometheusHandler, {}),
]
if (_listing := _sidebar_listing()) is not None:
    routes.append((r"individual-plots\.json", _listing, {}))


def serve(scheduler: Any) -> None:
    """Add the routes to a running scheduler's web server unless it serves them already
    (from its configuration, or an earlier plugin). Routes added later take precedence
    over those the server started with."""
    app = getattr(scheduler, "http_application", None)
    if app is None:  # no web server (dashboard off)
        return
    prefix = _prefix(app)
    if _served(app, f"{prefix}dslide/metrics"):
        return
    app.add_handlers(r".*", get_handlers(scheduler, [__name__], prefix))


def _served(app: Any, path: str) -> bool:
    request = HTTPServerRequest(
        start_line=RequestStartLine("GET", path, "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "localhost"}),
    )
    found = app.find_handler(request)
    return issubclass(getattr(found, "handler_class", type(None)), PrometheusHandler)


def _prefix(app: Any) -> str:
    """The dashboard's URL prefix ("/" unless ``--dashboard-prefix``). The scheduler keeps
    it only in its routes: read it off the one Dask always serves, ``health``."""
    for rule in getattr(app.wildcard_router, "rules", []):
        pattern = getattr(getattr(rule.matcher, "regex", None), "pattern", "")
        if pattern.endswith("health$"):
            return pattern[: -len("health$")] or "/"
    return "/"

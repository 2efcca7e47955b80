"""The kubelet's unauthenticated HTTP endpoints, as ASGI app factories (`klet.obs.get_app`).

- `create_app`: the read-only API (upstream `readOnlyPort`, off by default):
  `GET /pods` (the node's pods as a v1 PodList, each with its latest computed status,
  served as the view encoded it once per change: podcache.py),
  `GET /healthz`, `GET /metrics` (every service's kubelet metrics: nodemetrics.py),
  `GET /metrics/probes` (the prober's, apart as upstream serves them) and
  `GET /metrics/cadvisor` (containermetrics.py: through the kubelet API's CRI client,
  or, with that API off, a client of its own; wiring decides, this app serves the page
  it is given).
- `create_healthz_app`: the `healthzBindAddress:healthzPort` listener, `/healthz` only.

Both answer from the in-memory pod view and never touch Redis on a request, so they keep
answering (with the last view) while the bus is down. `/healthz` says "ok" whenever the
process is serving: a Redis outage must not make a liveness probe restart this service,
and a dead refresh loop already ends the process (supervised root tasks). The private
service port's /healthz /readyz /metrics come from `klet.obs`, not from here.

Neither app holds a client, so neither needs a lifespan. Both are a few GET paths on
Starlette (`klet.obs.get_app`) rather than FastAPI: importing FastAPI (pydantic) costs the
process about 20 MB resident, which only the kubelet API on --port (kubeletapi) needs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from klet.model.types import JSON
from klet.obs import CONTENT_TYPE, get_app
from klet.status_reporter import listing
from klet.status_reporter.nodemetrics import LocalMetrics
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

JSON_MEDIA_TYPE = "application/json"


@runtime_checkable
class PodView(Protocol):
    """What the HTTP API reads: the current PodList, already encoded."""

    def pod_list_json(self) -> bytes: ...


class ListingView(Protocol):
    """A view that gives the PodList, encoded or not (the kubelet API's `pods`)."""

    def pod_list(self) -> JSON: ...


def pod_list_body(view: ListingView) -> bytes:
    """The `/pods` body from `view`: the encoding it keeps when it keeps one (the pod
    cache: once per change, shared by this port and the kubelet API), else its PodList
    encoded now, the same bytes (listing.encode_pod_list)."""
    if isinstance(view, PodView):
        return view.pod_list_json()
    return listing.encode_pod_list(view.pod_list())


class ApiDeps(Protocol):
    """The part of the service's dependencies the HTTP apps use."""

    @property
    def pods(self) -> PodView: ...

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def node_metrics(self) -> MetricsPages | None: ...

    @property
    def container_metrics(self) -> ContainerMetricsPage | None: ...


class MetricsPages(Protocol):
    """`/metrics` and `/metrics/probes` as served (klet.status_reporter.nodemetrics)."""

    async def metrics(self) -> bytes: ...

    async def probes(self) -> bytes: ...


class ContainerMetricsPage(Protocol):
    """`/metrics/cadvisor` (klet.status_reporter.containermetrics)."""

    async def page(self) -> bytes: ...


async def _healthz(_request: Request) -> Response:
    return PlainTextResponse("ok")


def create_app(deps: ApiDeps) -> Starlette:
    """The kubelet read-only API app over `deps.pods` and `deps.registry`."""

    async def pods(_request: Request) -> Response:
        # The view's kept encoding (once per change), not a JSONResponse per request.
        return Response(deps.pods.pod_list_json(), media_type=JSON_MEDIA_TYPE)

    pages = deps.node_metrics if deps.node_metrics is not None else LocalMetrics(deps.registry)

    async def metrics(_request: Request) -> Response:
        return Response(await pages.metrics(), media_type=CONTENT_TYPE)

    async def probes(_request: Request) -> Response:
        return Response(await pages.probes(), media_type=CONTENT_TYPE)

    routes = {"/healthz": _healthz, "/pods": pods, "/metrics": metrics, "/metrics/probes": probes}
    containers = deps.container_metrics
    if containers is not None:

        async def cadvisor(_request: Request) -> Response:
            return Response(await containers.page(), media_type=CONTENT_TYPE)

        routes["/metrics/cadvisor"] = cadvisor
    return get_app(routes)


def create_healthz_app() -> Starlette:
    """The healthz-only app of `healthzBindAddress:healthzPort`."""
    return get_app({"/healthz": _healthz})

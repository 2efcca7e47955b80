"""The kubelet's unauthenticated HTTP endpoints, as ASGI app factories (`klet.obs.get_app`).

- `create_app`: the read-only API (upstream `readOnlyPort`, off by default):
  `GET /pods` (the node's pods as a v1 PodList, each with its latest computed status,
  served as the view encoded it once per change: podcache.py),
  `GET /healthz` and `/healthz/<name>` (upstream's checks ping, log and syncloop, as
  the kubelet API runs them: kubeletapi/healthchecks.py), `GET` and `DELETE`
  `/metrics/slis` (the registry those checks are recorded in, shared with the kubelet
  API and the healthz port), `GET /metrics` (every service's kubelet metrics: nodemetrics.py),
  `GET /metrics/probes` (the prober's, apart as upstream serves them) and
  `GET /metrics/cadvisor` (containermetrics.py: through the kubelet API's CRI client,
  or, with that API off, a client of its own; wiring decides, this app serves the page
  it is given).
- `create_healthz_app`: the `healthzBindAddress:healthzPort` listener, `/healthz` (and
  `/healthz/ping`) with upstream's one check there, `ping`, recorded on /metrics/slis.

Both answer from the in-memory pod view and never touch Redis on a request, so they keep
answering (with the last view) while the bus is down. No check reads the bus: a Redis
outage must not make a liveness probe restart this service, and a dead refresh loop
already ends the process (supervised root tasks). The read-only port's `syncloop` check
asks syncloop's private port, as the kubelet API's does. The private
service port's /healthz /readyz /metrics come from `klet.obs`, not from here.

Neither app holds a client, so neither needs a lifespan. Both are a few paths on
Starlette (`klet.obs.get_app`) rather than FastAPI: importing FastAPI (pydantic) costs the
process about 20 MB resident, which only the kubelet API on --port (kubeletapi) needs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol, runtime_checkable

from klet.model.types import JSON
from klet.obs import CONTENT_TYPE, get_app
from klet.obs.health import Endpoint
from klet.status_reporter.kubeletapi.healthchecks import (
    HealthChecks,
    Report,
    SliMetrics,
    healthz_port_checks,
)
from klet.status_reporter.kubeletapi.requestmetrics import path_buckets, request_labels
from klet.status_reporter.metrics.nodemetrics import LocalMetrics
from klet.status_reporter.pods import listing
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

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

    @property
    def health(self) -> HealthChecks:
        """The kubelet API's checks (ping, log, syncloop), recording in `slis`."""
        ...

    @property
    def slis(self) -> SliMetrics: ...


class MetricsPages(Protocol):
    """`/metrics` and `/metrics/probes` as served (klet.status_reporter.metrics.nodemetrics)."""

    async def metrics(self) -> bytes: ...

    async def probes(self) -> bytes: ...


class ContainerMetricsPage(Protocol):
    """`/metrics/cadvisor` (klet.status_reporter.metrics.containermetrics)."""

    async def page(self) -> bytes: ...


NOSNIFF = {"X-Content-Type-Options": "nosniff"}


def _report(report: Report) -> Response:
    return PlainTextResponse(report.body, status_code=report.status, headers=NOSNIFF)


def health_routes(checks: HealthChecks) -> dict[str, Endpoint]:
    """`/healthz` (`?verbose`, `?exclude=<name>`) and `/healthz/<name>` over `checks`, as
    the kubelet API answers them."""

    async def healthz(request: Request) -> Response:
        excluded = set(request.query_params.getlist("exclude"))
        verbose = "verbose" in request.query_params
        return _report(await checks.report(excluded=excluded, verbose=verbose))

    async def healthz_one(request: Request) -> Response:
        report = await checks.one(request.path_params["name"])
        if report is None:
            return PlainTextResponse("404 page not found\n", status_code=404)
        return _report(report)

    return {"/healthz": healthz, "/healthz/{name}": healthz_one}


def _with_sli_reset(app: Starlette, slis: SliMetrics) -> Starlette:
    """`DELETE /metrics/slis` on `app` (upstream's SLIMetricsWithReset)."""

    async def reset(_request: Request) -> Response:
        slis.reset()
        return PlainTextResponse("metrics reset\n")

    app.router.routes.append(Route("/metrics/slis", reset, methods=["DELETE"]))
    return app


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

    async def slis(_request: Request) -> Response:
        return Response(deps.slis.page(), media_type=CONTENT_TYPE)

    routes = {
        **health_routes(deps.health),
        "/pods": pods,
        "/metrics": metrics,
        "/metrics/probes": probes,
        "/metrics/slis": slis,
    }
    containers = deps.container_metrics
    if containers is not None:

        async def cadvisor(_request: Request) -> Response:
            return Response(await containers.page(), media_type=CONTENT_TYPE)

        routes["/metrics/cadvisor"] = cadvisor
    return _with_sli_reset(get_app(routes), deps.slis)


class RequestRecorder(Protocol):
    """upstream's kubelet server request metrics (metrics.instruments.HttpRequestMetrics)."""

    def started(self, labels: tuple[str, str, str, str]) -> None: ...

    def done(self, labels: tuple[str, str, str, str], seconds: float) -> None: ...


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


def counted_app(
    app: ASGIApp, http: RequestRecorder, *, clock: Callable[[], float] = time.monotonic
) -> ASGIApp:
    """`app` (the read-only API) with every request counted, in flight and timed as
    upstream's read-only server records them: server_type readonly, its paths those of a
    server without debugging handlers (kubeletapi.requestmetrics)."""
    buckets = path_buckets(debugging=False, checkpoint=False)

    async def counted(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        verb, root, long_running = request_labels(scope["method"], scope["path"], buckets)
        labels = (verb, root, "readonly", long_running)
        http.started(labels)
        started = clock()
        try:
            await app(scope, receive, send)
        finally:
            http.done(labels, clock() - started)

    return counted


def create_healthz_app(slis: SliMetrics) -> Starlette:
    """The healthz-only app of `healthzBindAddress:healthzPort`: `ping`, recorded in
    `slis`."""
    return get_app(health_routes(healthz_port_checks(slis)))

"""The kubelet's unauthenticated HTTP endpoints, as FastAPI app factories.

- `create_app`: the read-only API (upstream `readOnlyPort`, off by default):
  `GET /pods` (the node's pods as a v1 PodList, each with its latest computed status),
  `GET /healthz` and `GET /metrics`.
- `create_healthz_app`: the `healthzBindAddress:healthzPort` listener, `/healthz` only.

Both answer from the in-memory pod view and never touch Redis on a request, so they keep
answering (with the last view) while the bus is down. `/healthz` says "ok" whenever the
process is serving: a Redis outage must not make a liveness probe restart this service,
and a dead refresh loop already ends the process (supervised root tasks). The private
service port's /healthz /readyz /metrics come from `klet.obs`, not from here.

Neither app holds a client, so neither needs a lifespan. The secure port (10250, with
authentication) belongs to cluster mode and is not served yet.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from klet.model.types import JSON
from klet.obs import render
from prometheus_client import CollectorRegistry


class PodView(Protocol):
    """What the HTTP API reads: the current PodList."""

    def pod_list(self) -> JSON: ...


class ApiDeps(Protocol):
    """The part of the service's dependencies the HTTP apps use."""

    @property
    def pods(self) -> PodView: ...

    @property
    def registry(self) -> CollectorRegistry: ...


def _add_healthz(app: FastAPI) -> None:
    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"


def create_app(deps: ApiDeps) -> FastAPI:
    """The kubelet read-only API app over `deps.pods` and `deps.registry`."""
    app = FastAPI(title="klet read-only API", docs_url=None, redoc_url=None, openapi_url=None)
    _add_healthz(app)

    @app.get("/pods")
    async def pods() -> JSONResponse:
        return JSONResponse(deps.pods.pod_list())

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = render(deps.registry)
        return Response(body, media_type=content_type)

    return app


def create_healthz_app() -> FastAPI:
    """The healthz-only app of `healthzBindAddress:healthzPort`."""
    app = FastAPI(title="klet healthz", docs_url=None, redoc_url=None, openapi_url=None)
    _add_healthz(app)
    return app

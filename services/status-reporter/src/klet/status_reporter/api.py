"""The kubelet's unauthenticated HTTP endpoints, as ASGI app factories (klet.obs.asgi).

- `create_app`: the read-only API (upstream `readOnlyPort`, off by default):
  `GET /pods` (the node's pods as a v1 PodList, each with its latest computed status),
  `GET /healthz` and `GET /metrics`.
- `create_healthz_app`: the `healthzBindAddress:healthzPort` listener, `/healthz` only.

Both answer from the in-memory pod view and never touch Redis on a request, so they keep
answering (with the last view) while the bus is down. `/healthz` says "ok" whenever the
process is serving: a Redis outage must not make a liveness probe restart this service,
and a dead refresh loop already ends the process (supervised root tasks). The private
service port's /healthz /readyz /metrics come from `klet.obs`, not from here.

Neither app holds a client, so neither needs a lifespan. Both are a few GET paths, written
against klet.obs.asgi rather than FastAPI: importing FastAPI costs the process about
20 MB resident, which only the kubelet API on --port (kubeletapi) needs.
"""

from __future__ import annotations

from typing import Protocol

from klet.model.types import JSON
from klet.obs import render
from klet.obs.asgi import Request, Response, Routes, json_response, text
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


async def _healthz(_request: Request) -> Response:
    return text("ok")


def create_app(deps: ApiDeps) -> Routes:
    """The kubelet read-only API app over `deps.pods` and `deps.registry`."""

    async def pods(_request: Request) -> Response:
        return json_response(deps.pods.pod_list())

    async def metrics(_request: Request) -> Response:
        body, content_type = render(deps.registry)
        return Response(body, content_type=content_type)

    return Routes({"/healthz": _healthz, "/pods": pods, "/metrics": metrics})


def create_healthz_app() -> Routes:
    """The healthz-only app of `healthzBindAddress:healthzPort`."""
    return Routes({"/healthz": _healthz})

"""A minimal ASGI app for the small GET-only endpoints: a path table, plain-text and
JSON responses, the lifespan protocol.

The private service port (/healthz /readyz /metrics) of every service and the
status-reporter's healthz and read-only ports answer a handful of GET paths each. FastAPI
(with Starlette and pydantic) costs about 20 MB resident per process to import, more than
the rest of such a service's HTTP needs together, so these apps are written against ASGI
directly and served by uvicorn (`klet.obs.health.serve_http`); FastAPI
stays where an API is served (the kubelet API on --port). The behaviour follows what the
FastAPI versions did: GET and HEAD only (405 with `Allow: GET, HEAD` otherwise), 404 with
a JSON `detail` for an unknown path, `text/plain; charset=utf-8` bodies.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["Request", "Response", "Routes", "json_response", "text"]

TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Request:
    """The parts of an HTTP request these apps look at."""

    path: str
    query: tuple[tuple[str, str], ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names

    def query_values(self, name: str) -> list[str]:
        return [v for k, v in self.query if k == name]

    def has_query(self, name: str) -> bool:
        return any(k == name for k, _ in self.query)


@dataclass(frozen=True)
class Response:
    body: bytes = b""
    status: int = 200
    content_type: str = TEXT
    headers: Mapping[str, str] = field(default_factory=dict)


def text(body: str, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(body.encode(), status, TEXT, dict(headers or {}))


def json_response(value: Any, status: int = 200) -> Response:
    """Compact UTF-8 JSON, as Starlette's JSONResponse renders it."""
    body = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode(), status, "application/json")


Handler = Callable[[Request], Awaitable[Response]]
PrefixHandler = Callable[[Request, str], Awaitable[Response]]


class Routes:
    """An ASGI app: exact paths, and prefixes whose one remaining path segment is passed
    to the handler (`/healthz/{name}`)."""

    def __init__(
        self,
        paths: Mapping[str, Handler],
        prefixes: Mapping[str, PrefixHandler] | None = None,
    ) -> None:
        self.paths = dict(paths)
        self.prefixes = dict(prefixes or {})

    def _find(self, path: str) -> Callable[[Request], Awaitable[Response]] | None:
        handler = self.paths.get(path)
        if handler is not None:
            return handler
        for prefix, one in self.prefixes.items():
            rest = path.removeprefix(prefix)
            if rest != path and rest and "/" not in rest:
                return lambda request: one(request, rest)
        return None

    async def __call__(
        self,
        scope: Mapping[str, Any],
        receive: Callable[[], Awaitable[Mapping[str, Any]]],
        send: Callable[[Mapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":  # nothing to open or close
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        handler = self._find(scope["path"])
        method = scope["method"]
        if handler is None:
            response = json_response({"detail": "Not Found"}, 404)
        elif method not in ("GET", "HEAD"):
            response = Response(
                b'{"detail":"Method Not Allowed"}',
                405,
                "application/json",
                {"allow": "GET, HEAD"},
            )
        else:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), True)
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            response = await handler(Request(scope["path"], tuple(query), headers))
        raw = [
            (b"content-type", response.content_type.encode("latin-1")),
            (b"content-length", str(len(response.body)).encode()),
        ]
        for name, value in response.headers.items():
            raw.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await send({"type": "http.response.start", "status": response.status, "headers": raw})
        body = b"" if method == "HEAD" else response.body
        await send({"type": "http.response.body", "body": body})

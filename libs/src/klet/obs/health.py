"""The private /healthz, /readyz and /metrics endpoints every klet service serves.

`create_health_app(registry=..., checks=..., ready=...)` builds a small Starlette app
(`get_app`: GET and HEAD routes, 404 and 405 answered with a JSON `detail` as FastAPI
does; not FastAPI itself, whose pydantic would cost each service about 20 MB); its
responses follow the upstream kubelet/apiserver healthz handler so existing probes and
muscle memory work: `ok` with 200 when every check passes; with `?verbose` one
`[+]name ok` line per check then `healthz check passed`; on failure status 500 and the
same list with `[-]name failed: reason withheld` and `healthz check failed` (reasons go
to the log, not to unauthenticated callers); `?exclude=name` skips a check;
`/healthz/<name>` runs one. `/readyz` is the same list plus the service's `ready`
callable. `/metrics` is the Prometheus text format (OpenMetrics when asked for).

What the two mean, the same in every klet service:

- `/healthz`: the process is alive and its loops run. A standby replica (one not
  holding its service's lease) is healthy: a liveness probe or container health check
  (`klet healthcheck`) must never restart a replica for standing by. Checks of a loop
  that only the leader runs pass while standing by.
- `/readyz`: this replica is acting — it holds its service's lease and has caught up.
  pod-source: leading, every configured source delivered and the bus answered;
  syncloop: leading and the desired set read; eviction: leading and one monitoring
  pass made; image-gc: leading, images detected and GarbageCollector served;
  status-reporter: its pod view loaded and the bus reachable (its lease, when it has
  one, belongs in the same callable). A standby is not ready, so a scraper or an
  operator finds the acting replica among those published under
  `<run-dir>/ports/<service>/` (klet.portfiles) by its /readyz.

`serve_http(app, host=..., port=..., name=...)` runs uvicorn (its h11 protocol, no
WebSocket) inside the current event loop as one of the service's supervised root tasks:
it binds the socket itself (so a busy port is an OSError at once, port 0 works and
SO_REUSEPORT can be set), sets `ready` once serving, never installs signal handlers (the
process's supervisor owns SIGTERM), writes no access log, and shuts down gracefully when
its task is cancelled: the listener closes, idle connections close, requests being
answered get `GRACEFUL_S` to finish. The services call it through
`klet.obs.serviceport.serve_service_port`, which adds the port files. The kubelet API on
10250 has its own server (`klet.status_reporter.kubeletapi.server`: it hands the raw
upgraded socket to exec/attach/port-forward, which uvicorn cannot).

Trade-off: checks run on every probe, concurrently, each bounded by `check_timeout`; a
check must be cheap (read a flag a loop maintains) rather than do I/O itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

import uvicorn
from klet.obs.logs import OnceLogger
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["GRACEFUL_S", "HealthCheck", "create_health_app", "get_app", "serve_http"]

log = logging.getLogger(__name__)

HealthCheck = Callable[[], bool | Awaitable[bool]]
"""A named health condition: True when healthy; may be async; raising counts as failed."""

_NOSNIFF = {"X-Content-Type-Options": "nosniff"}

Endpoint = Callable[[Request], Awaitable[Response]]


async def _http_error(_request: Request, exc: Exception) -> Response:
    """404 and 405 as FastAPI answers them (a JSON `detail`), with a stable Allow."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if "Allow" in headers:  # Starlette joins a set: the order would vary between runs
        headers["Allow"] = ", ".join(sorted(headers["Allow"].split(", ")))
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=headers)


def get_app(routes: Mapping[str, Endpoint]) -> Starlette:
    """A Starlette app answering GET and HEAD on `routes` (path -> endpoint; a path may
    hold one `{parameter}` segment); anything else is a 404 or 405 with a JSON detail.
    A trailing slash is not redirected: `/healthz/` is a 404, as a probe should see."""
    app = Starlette(
        routes=[Route(path, endpoint, methods=["GET"]) for path, endpoint in routes.items()],
        exception_handlers={HTTPException: _http_error},
    )
    app.router.redirect_slashes = False
    return app


def text(body: str, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return PlainTextResponse(body, status, headers=dict(headers or {}))


GRACEFUL_S = 5
"""Seconds requests being answered get to finish once serve_http is cancelled."""


class _Checker:
    def __init__(self, checks: Mapping[str, HealthCheck], timeout: float) -> None:
        self.checks = dict(checks)
        self.timeout = timeout
        self.failures = OnceLogger(log, level=logging.WARNING)

    async def run_one(self, name: str) -> bool:
        check = self.checks[name]
        try:
            result = check()
            if inspect.isawaitable(result):
                async with asyncio.timeout(self.timeout):
                    result = await result
        except Exception as exc:  # a raising check is a failed check, never a 500 crash
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.failures.error(name, f"health check {name} failed: {reason}", check=name)
            return False
        if not result:
            self.failures.error(name, f"health check {name} failed", check=name)
            return False
        self.failures.clear(name, f"health check {name} passed", check=name)
        return True

    async def report(self, kind: str, request: Request, names: list[str]) -> Response:
        """The upstream-style report of the checks `names`, honouring ?verbose and ?exclude."""
        excluded = set(request.query_params.getlist("exclude"))
        run = [n for n in names if n not in excluded]
        results = dict(zip(run, await asyncio.gather(*map(self.run_one, run)), strict=True))
        lines = []
        for name in names:
            if name in excluded:
                lines.append(f"[+]{name} excluded: ok")
            elif results[name]:
                lines.append(f"[+]{name} ok")
            else:
                lines.append(f"[-]{name} failed: reason withheld")
        unknown = sorted(excluded - set(names))
        if unknown:
            missing = ", ".join(unknown)
            lines.append(f"warn: some health checks cannot be excluded: no matches for {missing}")
        if not all(results.values()):
            body = "\n".join([*lines, f"{kind} check failed"]) + "\n"
            return text(body, 500, _NOSNIFF)
        if "verbose" not in request.query_params:
            return text("ok", headers=_NOSNIFF)
        body = "\n".join([*lines, f"{kind} check passed"]) + "\n"
        return text(body, headers=_NOSNIFF)


def create_health_app(
    *,
    registry: CollectorRegistry,
    checks: Mapping[str, HealthCheck],
    ready: Callable[[], bool],
    check_timeout: float = 5.0,
) -> Starlette:
    """The app of a service's private port: /healthz, /healthz/{name}, /readyz, /metrics.

    checks: named health conditions, reported in this order after a built-in "ping".
    ready: whether the service is ready to act (sources synced, lease held, ...).
    check_timeout: seconds an async check may take before it counts as failed.
    """
    if "ready" in checks:
        raise ValueError('"ready" is reserved for the readiness callable')
    health_names = ["ping", *(n for n in checks if n != "ping")]
    checker = _Checker({"ping": lambda: True, **checks, "ready": ready}, check_timeout)

    async def healthz(request: Request) -> Response:
        return await checker.report("healthz", request, health_names)

    async def healthz_one(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in health_names:
            return text(f"no health check named {name}\n", 404)
        if await checker.run_one(name):
            return text("ok", headers=_NOSNIFF)
        return text(f"internal server error: {name} check failed\n", 500, _NOSNIFF)

    async def readyz(request: Request) -> Response:
        return await checker.report("readyz", request, [*health_names, "ready"])

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=content_type)

    return get_app(
        {
            "/healthz": healthz,
            "/healthz/{name}": healthz_one,
            "/readyz": readyz,
            "/metrics": metrics,
        }
    )


class _Server(uvicorn.Server):
    """uvicorn's server inside a klet service: signals stay with the process's supervisor,
    `ready` is set once it serves, and its loop wakes once a second (to refresh the Date
    header) rather than ten times, or at once when `stop()` is called."""

    def __init__(self, config: uvicorn.Config, ready: asyncio.Event | None) -> None:
        super().__init__(config)
        self._ready = ready
        self._stopping = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._ready is not None:
            self._ready.set()

    async def main_loop(self) -> None:
        while not await self.on_tick(0):  # counter 0: the Date header is refreshed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._stopping.wait()

    def stop(self, *, force: bool = False) -> None:
        self.should_exit = True
        self.force_exit = self.force_exit or force
        self._stopping.set()


async def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    if not infos:  # pragma: no cover - getaddrinfo raises instead
        raise OSError(f"cannot resolve {host!r}")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        # Listening already, so `on_listening` tells the truth: a client that connects
        # before the server accepts waits in the backlog instead of being refused.
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_http(
    app: Any,
    *,
    host: str,
    port: int,
    name: str,
    ready: asyncio.Event | None = None,
    on_listening: Callable[[str, int], None] | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve the ASGI `app` on host:port until cancelled (then shut down gracefully).

    Raises OSError when the address cannot be bound and RuntimeError when the app's
    lifespan start-up fails. `on_listening(host, port)` is called with the bound
    address before `ready` is set (useful with port 0). `reuse_port` sets SO_REUSEPORT,
    so several processes (replicas of one service) can listen on the same port: the
    kernel spreads new connections over them, and one replica dying drops only its own
    connections. Every process sharing the port must set it (and run as the same user).
    """
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        interface="asgi3",
        lifespan="on",
        log_config=None,  # records go to klet's root handler (klet.obs.logs)
        access_log=False,
        proxy_headers=False,  # nothing sits in front of these ports
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    server = _Server(config, ready)
    try:
        sock = await _bind(host, port, reuse_port=reuse_port)
    except OSError as exc:
        raise OSError(exc.errno, f"{name}: cannot listen on {host}:{port}: {exc.strerror}") from exc
    bound_host, bound_port = sock.getsockname()[:2]
    log.info("HTTP listening", extra={"server": name, "host": bound_host, "port": bound_port})

    async def run() -> None:
        # uvicorn calls sys.exit() when the lifespan start-up fails; a SystemExit leaving
        # a task would stop the whole event loop, so it becomes an ordinary error here.
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:
            raise RuntimeError(f"{name}: HTTP server failed to start") from exc

    try:
        if on_listening is not None:
            on_listening(bound_host, bound_port)
        task = asyncio.create_task(run(), name=f"{name}-http")
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            server.stop()
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:  # cancelled again while closing: drop the rest now
                server.stop(force=True)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            except Exception:
                log.exception("HTTP server failed while stopping", extra={"server": name})
            raise
    finally:
        sock.close()
        log.info("stopped serving HTTP", extra={"server": name})

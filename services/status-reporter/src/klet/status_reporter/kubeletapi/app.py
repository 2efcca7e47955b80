"""The kubelet API's endpoints as an ASGI app (`create_app(deps)`), and the resolution of
streaming requests to the runtime's URL (`resolve_stream_url`).

Authentication and authorization are not here: `server.py` decides them for every
request before it reaches this app or the streaming proxy, so this app can be tested
in-process through `httpx.ASGITransport` like any other (STYLE rule 22).

Endpoints, as upstream's kubelet serves them on its secure port: `/healthz` and
`/healthz/{ping,log,syncloop}` (upstream's named checks, healthchecks.py), `/metrics/slis`
(the SLI metrics recording them; DELETE resets them), `/pods`
(the pod view's PodList, the same one the read-only port serves), `/runningpods/`
(pods as the runtime sees them), `/metrics` (every service's kubelet metrics, gathered
by `nodemetrics.py`), `/metrics/probes` (the prober's, as upstream serves them apart),
`/metrics/resource` (metrics-server's
CPU and memory series, from the summary), `/metrics/cadvisor` (cAdvisor's `container_*`
and `machine_*` series, containermetrics.py), `/configz`, `/stats/summary`,
`/containerLogs/{ns}/{pod}/{container}`, `/logs/<path>` (the node's /var/log:
nodelogs.py), `/checkpoint/{ns}/{pod}/{container}` (POST,
with the ContainerCheckpoint gate: checkpoint.py), `/run/{ns}/{pod}[/{uid}]/{container}` (the
command bounded by runtimeRequestTimeout, as upstream's CRI deadline bounds it); exec,
attach and portForward need an upgrade and are proxied by `server.py` after
`resolve_stream_url`: without one they answer 400. Error bodies are upstream's plain
text. With enableDebuggingHandlers off, the debugging endpoints answer 405 "Debug
endpoints are disabled.", as upstream's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from klet.bus import BusError
from klet.cri.errors import CRIError
from klet.cri.errors import NotFound as CRINotFound
from klet.model.types import JSON
from klet.obs import CONTENT_TYPE
from klet.stats import StatsProvider
from klet.status_reporter.kubeletapi import lookup, nodelogs
from klet.status_reporter.kubeletapi.checkpoint import CheckpointError, checkpoint
from klet.status_reporter.kubeletapi.containerlogs import container_logs_response
from klet.status_reporter.kubeletapi.deps import KubeletApiDeps, host_reader
from klet.status_reporter.kubeletapi.healthchecks import Report, kubelet_health_checks
from klet.status_reporter.kubeletapi.readonly import JSON_MEDIA_TYPE, pod_list_body
from klet.status_reporter.kubeletapi.resourcemetrics import resource_metrics
from klet.status_reporter.kubeletapi.routes import (
    BadRequest,
    StreamTarget,
    stream_options,
)
from klet.status_reporter.kubeletapi.stats import SummaryProvider
from klet.status_reporter.metrics.containermetrics import ContainerMetrics
from klet.status_reporter.metrics.nodemetrics import LocalMetrics

log = logging.getLogger(__name__)

DEBUG_DISABLED = "Debug endpoints are disabled.\n"
_NOSNIFF = {"X-Content-Type-Options": "nosniff"}


class HttpProblem(Exception):
    """An error answer: status and plain-text body."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(body)
        self.status = status
        self.body = body


def _text(status: int, body: str) -> PlainTextResponse:
    return PlainTextResponse(body, status_code=status)


async def resolve_stream_url(
    deps: KubeletApiDeps, target: StreamTarget, query: str, *, websocket: bool
) -> str:
    """The runtime's streaming URL for an exec/attach/portForward request.

    Raises HttpProblem with upstream's status and message.
    """
    if not deps.settings.enable_debugging_handlers:
        raise HttpProblem(405, DEBUG_DISABLED)
    try:
        opts = stream_options(
            target.kind, parse_qs(query, keep_blank_values=True), websocket=websocket
        )
    except BadRequest as err:
        raise HttpProblem(400, str(err)) from err
    pod = lookup.find_pod(deps.pods.pod_list(), target.namespace, target.pod)
    if pod is None:
        raise HttpProblem(404, "pod does not exist")
    uid = lookup.pod_uid(pod)
    if target.uid and target.uid != uid:
        raise HttpProblem(404, "pod not found")
    rt = deps.runtime
    try:
        if target.kind == "portForward":
            sandbox = await lookup.ready_sandbox(rt, uid)
            return await rt.port_forward(sandbox, list(opts.ports))
        container = await lookup.running_container(rt, uid, target.container)
        streams = {
            "tty": opts.tty,
            "stdin": opts.stdin,
            "stdout": opts.stdout,
            "stderr": opts.stderr,
        }
        if target.kind == "exec":
            return await rt.exec(container, list(opts.command), **streams)
        return await rt.attach(container, **streams)
    except lookup.TargetError as err:
        raise HttpProblem(err.status, str(err)) from err
    except CRINotFound as err:
        raise HttpProblem(404, str(err)) from err
    except CRIError as err:
        raise HttpProblem(500, str(err)) from err


def create_app(deps: KubeletApiDeps) -> FastAPI:
    """The kubelet API app (no authentication: see `server.py`)."""
    app = FastAPI(title="klet kubelet API", docs_url=None, redoc_url=None, openapi_url=None)
    s = deps.settings
    stats = StatsProvider(deps.runtime, host_reader(deps))
    summary = SummaryProvider(node_name=s.node_name, stats=stats, volumes=deps.volumes)
    containers = ContainerMetrics(stats, deps.pods)

    @app.exception_handler(HttpProblem)
    async def problem(_: Request, err: HttpProblem) -> Response:
        return _text(err.status, err.body)

    def debugging() -> None:
        if not s.enable_debugging_handlers:
            raise HttpProblem(405, DEBUG_DISABLED)

    checks = kubelet_health_checks(syncloop=deps.syncloop, slis=deps.slis)

    def _report(report: Report) -> Response:
        return PlainTextResponse(report.body, status_code=report.status, headers=_NOSNIFF)

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        excluded = set(request.query_params.getlist("exclude"))
        verbose = "verbose" in request.query_params
        return _report(await checks.report(excluded=excluded, verbose=verbose))

    @app.get("/healthz/{name}")
    async def healthz_one(name: str) -> Response:
        report = await checks.one(name)
        if report is None:
            raise HttpProblem(404, "404 page not found\n")
        return _report(report)

    @app.get("/metrics/slis")
    async def metrics_slis() -> Response:
        return Response(deps.slis.page(), media_type=CONTENT_TYPE)

    @app.delete("/metrics/slis")
    async def metrics_slis_reset() -> Response:
        deps.slis.reset()
        return _text(200, "metrics reset\n")

    @app.get("/pods")
    async def pods() -> Response:
        # The pod cache's kept encoding, the read-only port's bytes (api.pod_list_body).
        return Response(pod_list_body(deps.pods), media_type=JSON_MEDIA_TYPE)

    @app.get("/runningpods/")
    async def running_pods() -> JSONResponse:
        debugging()
        try:
            sandboxes = await deps.runtime.list_pod_sandboxes()
            containers = await deps.runtime.list_containers()
        except CRIError as err:
            raise HttpProblem(500, str(err)) from err
        return JSONResponse(lookup.running_pods(sandboxes, containers))

    pages = deps.node_metrics if deps.node_metrics is not None else LocalMetrics(deps.registry)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await pages.metrics(), media_type=CONTENT_TYPE)

    @app.get("/metrics/probes")
    async def metrics_probes() -> Response:
        return Response(await pages.probes(), media_type=CONTENT_TYPE)

    @app.get("/metrics/cadvisor")
    async def metrics_cadvisor() -> Response:
        return Response(await containers.page(), media_type=CONTENT_TYPE)

    @app.get("/metrics/resource")
    async def metrics_resource() -> Response:
        try:
            data: JSON | None = await summary.summary(only_cpu_and_memory=True)
        except CRIError as err:
            log.warning("resource metrics without a summary", extra={"error": str(err)})
            data = None
        return Response(
            resource_metrics(data, now_ms=time.time_ns() // 1_000_000),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.get("/configz")
    async def configz() -> JSONResponse:
        debugging()
        return JSONResponse(s.configz)

    @app.get("/stats/summary")
    async def stats_summary(only_cpu_and_memory: str = "") -> JSONResponse:
        try:
            data = await summary.summary(only_cpu_and_memory=only_cpu_and_memory == "true")
        except CRIError as err:
            raise HttpProblem(500, f"Internal Error: failed to get summary stats: {err}") from err
        return JSONResponse(data)

    @app.get("/why/{namespace}/{pod_name}")
    async def why(namespace: str, pod_name: str) -> JSONResponse:
        """klet's own: the pod's history with the answer first (`klet why`), as JSON;
        authorized as nodes/proxy, as every path without a subresource of its own."""
        if deps.history is None:
            raise HttpProblem(404, "pod histories are not kept by this server")
        try:
            story = await deps.history(namespace, pod_name)
        except BusError as err:
            raise HttpProblem(503, f"cannot read the pod's history: {err}") from err
        if story is None:
            raise HttpProblem(404, f"no history of pod {namespace}/{pod_name} on this node")
        return JSONResponse(story)

    @app.get("/containerLogs/{namespace}/{pod_name}/{container}")
    async def container_logs(
        namespace: str, pod_name: str, container: str, request: Request
    ) -> Response:
        debugging()
        return await container_logs_response(
            deps, namespace, pod_name, container, request.url.query
        )

    @app.get("/logs/")
    @app.get("/logs/{logpath:path}")
    async def node_logs(logpath: str = "") -> Response:
        debugging()
        if not s.enable_system_log_handler:
            raise HttpProblem(405, nodelogs.DISABLED)
        answer = await asyncio.to_thread(nodelogs.resolve, s.node_log_dir, logpath)
        if answer.status == 301:
            return Response(status_code=301, headers={"Location": answer.location})
        if answer.file is not None:
            return FileResponse(answer.file)
        if answer.listing is not None:
            return HTMLResponse(answer.listing)
        raise HttpProblem(answer.status, answer.body)

    @app.post("/run/{namespace}/{pod_name}/{container}")
    @app.post("/run/{namespace}/{pod_name}/{uid}/{container}")
    async def run(
        namespace: str, pod_name: str, container: str, cmd: str = "", uid: str = ""
    ) -> Response:
        debugging()
        pod = lookup.find_pod(deps.pods.pod_list(), namespace, pod_name)
        if pod is None:
            raise HttpProblem(404, "pod does not exist")
        pod_uid = lookup.pod_uid(pod)
        if uid and uid != pod_uid:
            raise HttpProblem(404, "pod not found")
        # runtimeRequestTimeout bounds the command twice: the runtime stops it then
        # (CRI ExecSync timeout), and the answer does not wait past it should the
        # runtime not (a hung command would otherwise hold the request forever).
        timeout_s = s.runtime_request_timeout_s
        try:
            cid = await lookup.running_container(deps.runtime, pod_uid, container)
            async with asyncio.timeout(timeout_s):
                _, out, err = await deps.runtime.exec_sync(
                    cid, cmd.split(" "), timeout_s=max(1, math.ceil(timeout_s))
                )
        except TimeoutError as e:
            raise HttpProblem(
                500, f"command did not finish within runtimeRequestTimeout ({timeout_s:g}s)"
            ) from e
        except (lookup.TargetError, CRIError) as e:
            raise HttpProblem(500, str(e)) from e
        return Response(out + err, media_type="application/json")

    # Upstream serves it only with the debugging handlers (not as their 405): else a 404.
    if s.container_checkpoint and s.enable_debugging_handlers:

        @app.post("/checkpoint/{namespace}/{pod_name}/{container}")
        async def checkpoint_container(
            namespace: str, pod_name: str, container: str, request: Request
        ) -> Response:
            try:
                body = await checkpoint(
                    deps.runtime,
                    deps.pods.pod_list(),
                    s.root_dir,
                    (namespace, pod_name, container),
                    request.query_params.getlist("timeout"),
                )
            except CheckpointError as err:
                raise HttpProblem(err.status, err.body) from err
            return Response(body, media_type="application/json")

    for kind in ("exec", "attach"):
        for suffix in (
            "{namespace}/{pod_name}/{container}",
            "{namespace}/{pod_name}/{uid}/{container}",
        ):
            app.add_api_route(f"/{kind}/{suffix}", _needs_upgrade, methods=["GET", "POST"])
    for suffix in ("{namespace}/{pod_name}", "{namespace}/{pod_name}/{uid}"):
        app.add_api_route(f"/portForward/{suffix}", _needs_upgrade, methods=["GET", "POST"])
    return app


async def _needs_upgrade() -> Response:
    return _text(400, "Upgrade request required")

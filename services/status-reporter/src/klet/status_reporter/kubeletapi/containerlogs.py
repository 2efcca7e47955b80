"""The `/containerLogs/{namespace}/{pod}/{container}` endpoint: which container's log
(upstream's rules in `lookup`), where its file is, and the streamed answer.

The log's files are opened before the response starts, so a missing log is upstream's
400 "failed to open log file" rather than an empty 200, and a rotation after that
point changes nothing for this request; the response then owns them and closes them
when the stream ends or the client goes away.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from klet.cri.errors import CRIError
from klet.cri.types import ContainerState
from klet.model.layout import pod_log_dir_name
from klet.model.types import JSON, ContainerID
from klet.status_reporter.kubeletapi import lookup
from klet.status_reporter.kubeletapi.crilogs import LogOptionsError, parse_log_options
from klet.status_reporter.kubeletapi.deps import KubeletApiDeps
from klet.status_reporter.kubeletapi.logstream import LogFiles, stream_log


def _text(status: int, body: str) -> PlainTextResponse:
    return PlainTextResponse(body, status_code=status)


async def container_logs_response(
    deps: KubeletApiDeps, namespace: str, pod_name: str, container: str, query: str
) -> Response:
    try:
        opts = parse_log_options(parse_qs(query, keep_blank_values=True))
    except LogOptionsError as err:
        return _text(err.status, str(err))
    pod = lookup.find_pod(deps.pods.pod_list(), namespace, pod_name)
    if pod is None:
        return _text(404, f'pod "{pod_name}" does not exist\n')
    if not lookup.has_container(pod, container):
        return _text(404, f'container "{container}" not found in pod "{pod_name}"\n')
    try:
        cid = lookup.log_container_id(pod, container, previous=opts.previous)
    except lookup.TargetError as err:
        return _text(err.status, str(err))
    path = await log_path(deps, pod, container, cid, previous=opts.previous)
    try:
        files = await asyncio.to_thread(LogFiles.open, path)
    except OSError as err:
        return _text(400, f'failed to open log file "{path}": {err.strerror or err}')

    async def is_running() -> bool:
        try:
            status = await deps.runtime.container_status(cid)
        except CRIError:
            return False
        return status.state == ContainerState.RUNNING

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in stream_log(files, opts, is_running=is_running, policy=deps.follow):
                yield chunk
        finally:
            files.close()

    return StreamingResponse(body(), media_type="text/plain")


async def log_path(
    deps: KubeletApiDeps,
    pod: JSON,
    container: str,
    cid: ContainerID,
    *,
    previous: bool,
) -> str:
    """The log file of `cid`: CRI's log path while the runtime knows the container, else
    the conventional `<podLogsDir>/<ns>_<name>_<uid>/<container>/<restarts>.log`."""
    try:
        status = await deps.runtime.container_status(cid)
        if status.log_path:
            return status.log_path
    except CRIError:
        pass
    meta = pod.get("metadata") or {}
    restarts = lookup.restart_count(pod, container) - (1 if previous else 0)
    pod_dir = pod_log_dir_name(
        str(meta.get("namespace", "default")), str(meta.get("name", "")), str(meta.get("uid", ""))
    )
    return str(deps.settings.pod_logs_dir / pod_dir / container / f"{max(restarts, 0)}.log")

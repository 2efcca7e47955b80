"""Lifecycle hooks: postStart right after a container starts, preStop before it stops.

Upstream's rules, which the pod syncer relies on:

- postStart runs synchronously after StartContainer: the container does not count as
  started (and the pod worker goes no further) until it returns. On failure the event
  is `Warning FailedPostStartHook "PostStartHook failed"` (the handler's output stays out
  of events, where it could leak secrets), the container is killed like any other
  (`Killing` with message `FailedPostStartHook`, its preStop included) and it waits with
  reason `PostStartHookError` and the detailed message until it restarts per policy.
- preStop runs before the stop signal whenever a container is stopped (pod deletion,
  kill request, removal, spec change, liveness). It gets at most the grace period; the
  time it took (whole seconds, truncated) is taken off the grace period and StopContainer
  gets the rest, never less than 2 s. A failure records `Warning FailedPreStopHook
  "PreStopHook failed"` and the stop goes on. The preStop hooks of a pod's containers run
  in parallel.
- Actions: `exec` (CRI ExecSync), `httpGet` (non-2xx answers count as delivered, only a
  transport error fails it, and the User-Agent is `kube-lifecycle/<version>`), `sleep`
  (bounded by the grace period for preStop). `tcpSocket` is deprecated and accepted by
  validation, but upstream has no runner for it: a hook with only tcpSocket fails at run
  time with "Cannot run handler: invalid handler", and so does it here.
- An HTTPS `httpGet` hook whose server answers in plain HTTP is sent again over HTTP
  without its Authorization header (handlers.py); when that request is answered, the
  hook is delivered, the pod gets `Warning LifecycleHTTPFallback "request to HTTPS
  lifecycle hook <host:port> got HTTP response, retry with HTTP succeeded"` and
  kubelet_lifecycle_handler_http_fallbacks_total counts it, as upstream's
  runHTTPHandler (probes do not fall back there, nor here).

A container whose pod spec is gone (removed while syncloop was down) still gets its
preStop: the handler travels in the container's `io.kubernetes.container.preStopHandler`
annotation, as upstream's.

The exec and HTTP mechanics are shared with the prober (handlers.py); this module only
decides when hooks run, how long they may take, and what is reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo
from klet.model.types import JSON, ContainerID
from klet.syncloop.containers import execwait, handlers
from klet.syncloop.containers.handlers import HandlerResult
from klet.syncloop.eventrecorder import EventSink
from klet.syncloop.model import podspec

log = logging.getLogger(__name__)

LIFECYCLE_USER_AGENT = "kube-lifecycle/" + handlers.PROBE_USER_AGENT.partition("/")[2]
POST_START_HOOK_ERROR = "PostStartHookError"
HTTP_FALLBACK = "LifecycleHTTPFallback"


class HookRuntime(Protocol):
    """The CRI calls hooks need: ExecSync for exec actions, StopContainer for the kill
    (and the container's PID, to stop it only once it runs its command: execwait.py)."""

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]: ...

    async def stop_container(self, container_id: ContainerID, *, timeout_s: int) -> None: ...

    async def container_pid(self, container_id: ContainerID) -> int: ...


class StopNotes(Protocol):
    """Where a stop klet makes itself is noted before StopContainer, so the evented
    PLEG does not poll CRI to confirm the exit it causes (pods/runtime.ExitNotices)."""

    def expect_stop(self, object_id: str) -> None: ...

    def stop_failed(self, object_id: str) -> None: ...


def handler_kind(handler: JSON) -> str:
    """Which action a LifecycleHandler carries ("" when none upstream can run)."""
    for kind in ("exec", "httpGet", "sleep"):
        if handler.get(kind) is not None:
            return kind
    return ""


def remaining_grace(grace_s: int, elapsed_s: float) -> int:
    """What StopContainer gets after a preStop took `elapsed_s`: whole seconds, at least 2."""
    return max(grace_s - int(elapsed_s), podspec.MINIMUM_GRACE_PERIOD_S)


def pod_ref(pod: JSON) -> str:
    """`name_namespace(uid)`, how upstream names a pod in messages."""
    m = podspec.meta(pod)
    return f"{m.get('name', '')}_{m.get('namespace', 'default')}({m.get('uid', '')})"


def container_spec(pod: JSON | None, name: str) -> JSON:
    """The named container (or init container) of the pod's spec; just the name if absent."""
    for c in [*podspec.init_containers(pod or {}), *podspec.containers(pod or {})]:
        if c.get("name") == name:
            return c
    return {"name": name}


def restored_container(status: ContainerStatusInfo) -> JSON:
    """What the container's annotations keep of its spec: name, ports and preStop."""
    container: JSON = {"name": status.name}
    ports = status.annotations.get(L.CONTAINER_PORTS)
    handler = status.annotations.get(L.CONTAINER_PRESTOP_HANDLER)
    try:
        if ports:
            container["ports"] = json.loads(ports)
        if handler:
            container["lifecycle"] = {"preStop": json.loads(handler)}
    except ValueError:
        log.warning("unreadable container annotations", extra={"container": status.id})
    return container


def failure_message(
    pod: JSON, container: JSON, handler: JSON, result: HandlerResult, *, kind: str
) -> str:
    """The detailed message of a failed hook, worded as upstream's handler runner."""
    name = json.dumps(container.get("name", ""))
    where = f"for Container {name} in Pod {json.dumps(pod_ref(pod))} failed"
    if kind == "exec":
        command = list((handler.get("exec") or {}).get("command") or [])
        shown = "[" + " ".join(command) + "]"
        if result.error or result.message.endswith("timed out"):
            error = result.message
            output = ""
        else:
            error = f"command '{' '.join(command)}' exited with a non-zero status"
            output = result.message
        return (
            f"Exec lifecycle hook ({shown}) {where} - error: {error}, message: {json.dumps(output)}"
        )
    if kind == "httpGet":
        path = (handler.get("httpGet") or {}).get("path", "")
        return f"HTTP lifecycle hook ({path}) {where} - error: {result.message}"
    if kind == "sleep":
        seconds = (handler.get("sleep") or {}).get("seconds")
        return f"Sleep lifecycle hook ({seconds}) {where} - error: {result.message}"
    return f"Cannot run handler: {result.message}"


def _with_user_agent(action: JSON) -> JSON:
    headers = list(action.get("httpHeaders") or [])
    if any(str(h.get("name", "")).lower() == "user-agent" for h in headers):
        return action
    return {
        **action,
        "httpHeaders": [*headers, {"name": "User-Agent", "value": LIFECYCLE_USER_AGENT}],
    }


class PreStops:
    """preStop hooks started together for several containers; await them per container."""

    def __init__(self, tasks: dict[ContainerID, asyncio.Task[float]]) -> None:
        self._tasks = tasks

    async def wait(self, containers: Iterable[ContainerStatusInfo]) -> None:
        """Wait until the hooks of these containers have returned (or run out of time)."""
        pending = [self._tasks[c.id] for c in containers if c.id in self._tasks]
        if pending:
            await asyncio.gather(*pending)


class LifecycleHooks:
    def __init__(
        self,
        *,
        cri: HookRuntime,
        events: EventSink,
        host_ip: str = "",
        post_start_timeout_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        stops: StopNotes | None = None,
        on_sleep_cut_short: Callable[[], None] | None = None,
        on_http_fallback: Callable[[], None] | None = None,
    ) -> None:
        """`host_ip` stands in for the pod IP of host-network pods (httpGet without host);
        `post_start_timeout_s` bounds a postStart hook (runtimeRequestTimeout: upstream
        sets none, and a hook that never returns would hold the pod worker forever);
        `stops` is told of every StopContainer (None where no PLEG watches events);
        `on_sleep_cut_short` of every sleep action ended before its seconds were up (the
        time it was given ran out: upstream's kubelet_sleep_action_terminated_early_total);
        `on_http_fallback` of every HTTPS httpGet hook delivered over HTTP instead
        (upstream's kubelet_lifecycle_handler_http_fallbacks_total)."""
        self.stops = stops
        self.on_http_fallback = on_http_fallback
        self.on_sleep_cut_short = on_sleep_cut_short
        self.cri = cri
        self.events = events
        self.host_ip = host_ip
        self.post_start_timeout_s = post_start_timeout_s
        self.clock = clock
        self.sleep = sleep

    async def _run(
        self,
        pod: JSON,
        container: JSON,
        container_id: ContainerID,
        handler: JSON,
        *,
        pod_ip: str,
        timeout_s: float,
    ) -> tuple[bool, str]:
        """Run one handler: (ok, upstream's detailed message when it failed)."""
        kind = handler_kind(handler)
        if kind == "exec":
            command = [str(a) for a in (handler["exec"].get("command") or [])]
            result = await handlers.run_exec(self.cri, container_id, command, timeout_s=timeout_s)
        elif kind == "httpGet":
            result = await handlers.run_http_get(
                _with_user_agent(handler["httpGet"]),
                pod_ip=pod_ip or self.host_ip,
                container=container,
                timeout_s=timeout_s,
                http_fallback=True,
            )
            if result.fallback:
                self._fell_back(pod, result.fallback)
            if not result.ok and result.answered:
                # Upstream's hook client only fails on transport errors: any answer,
                # whatever its status code, means the hook was delivered.
                result = HandlerResult(True, result.message)
        elif kind == "sleep":
            seconds = float((handler.get("sleep") or {}).get("seconds") or 0)
            try:
                await self.sleep(min(seconds, timeout_s))
            except asyncio.CancelledError:
                self._sleep_cut_short()
                raise
            if seconds > timeout_s:
                self._sleep_cut_short()
            result = HandlerResult(True, "")
        else:
            result = HandlerResult(False, f"invalid handler: {json.dumps(handler, sort_keys=True)}")
        if result.ok:
            return True, ""
        return False, failure_message(pod, container, handler, result, kind=kind)

    def _fell_back(self, pod: JSON, host: str) -> None:
        if self.on_http_fallback is not None:
            self.on_http_fallback()
        if pod:  # an orphan's preStop has no pod to record the Event on
            message = (
                f"request to HTTPS lifecycle hook {host} got HTTP response, "
                "retry with HTTP succeeded"
            )
            self.events.emit(pod, "Warning", HTTP_FALLBACK, message)

    def _sleep_cut_short(self) -> None:
        if self.on_sleep_cut_short is not None:
            self.on_sleep_cut_short()

    async def post_start(
        self,
        pod: JSON,
        container: JSON,
        container_id: ContainerID,
        *,
        pod_ip: str,
        grace_s: int,
    ) -> tuple[str, str] | None:
        """Run the container's postStart hook, if any; None when it succeeded.

        On failure: the events, the kill (with `grace_s`, preStop included), and the
        (reason, message) the container waits with.
        """
        handler = (container.get("lifecycle") or {}).get("postStart")
        if not handler:
            return None
        name = container["name"]
        try:
            async with asyncio.timeout(self.post_start_timeout_s):
                ok, message = await self._run(
                    pod,
                    container,
                    container_id,
                    handler,
                    pod_ip=pod_ip,
                    timeout_s=self.post_start_timeout_s,
                )
        except TimeoutError:
            ok, message = (
                False,
                (
                    f"PostStart hook for Container {json.dumps(name)} in Pod "
                    f"{json.dumps(pod_ref(pod))} did not finish in {self.post_start_timeout_s:g}s"
                ),
            )
        if ok:
            return None
        log.warning(
            "postStart hook failed",
            extra={"pod": pod_ref(pod), "container": name, "detail": message},
        )
        path = podspec.field_path(pod, name)
        self.events.emit(
            pod, "Warning", "FailedPostStartHook", "PostStartHook failed", field_path=path
        )
        self.events.emit(pod, "Normal", "Killing", "FailedPostStartHook", field_path=path)
        await self.kill_container(pod, container, container_id, grace_s=grace_s, pod_ip=pod_ip)
        return POST_START_HOOK_ERROR, message

    async def pre_stop(
        self,
        pod: JSON | None,
        container: JSON,
        container_id: ContainerID,
        *,
        budget_s: float,
        pod_ip: str,
    ) -> float:
        """Run the container's preStop hook, if any, for at most `budget_s`; the seconds it took."""
        handler = (container.get("lifecycle") or {}).get("preStop")
        if not handler or budget_s <= 0:
            return 0.0
        start = self.clock()
        context = pod if pod is not None else {}
        try:
            async with asyncio.timeout(budget_s):
                ok, message = await self._run(
                    context, container, container_id, handler, pod_ip=pod_ip, timeout_s=budget_s
                )
        except TimeoutError:
            log.info(
                "preStop hook not completed in grace period",
                extra={"container": container.get("name"), "grace": budget_s},
            )
            ok, message = True, ""  # cut short, not failed: upstream records no event
        if not ok:
            log.warning(
                "preStop hook failed",
                extra={
                    "pod": pod_ref(context),
                    "container": container.get("name"),
                    "detail": message,
                },
            )
            if pod is not None:
                self.events.emit(
                    pod,
                    "Warning",
                    "FailedPreStopHook",
                    "PreStopHook failed",
                    field_path=podspec.field_path(pod, str(container.get("name", ""))),
                )
        return self.clock() - start

    async def kill_container(
        self,
        pod: JSON | None,
        container: JSON,
        container_id: ContainerID,
        *,
        grace_s: int,
        pod_ip: str,
    ) -> None:
        """upstream killContainer after its event: preStop, then StopContainer with the rest."""
        elapsed = await self.pre_stop(pod, container, container_id, budget_s=grace_s, pod_ip=pod_ip)
        await self.stop(container_id, timeout_s=remaining_grace(grace_s, elapsed))

    async def stop(
        self, container_id: ContainerID, *, timeout_s: int, started_at_ns: int | None = None
    ) -> None:
        """StopContainer; a graceful one once the container runs its command, so that
        its stop signal is not lost on the runtime's init (execwait.py)."""
        if timeout_s > 0:
            await execwait.wait_for_exec(
                self.cri, container_id, started_at_ns=started_at_ns, sleep=self.sleep
            )
        if self.stops is not None:
            self.stops.expect_stop(container_id)
        try:
            await self.cri.stop_container(container_id, timeout_s=timeout_s)
        except BaseException:
            if self.stops is not None:
                self.stops.stop_failed(container_id)
            raise

    def start_pre_stops(
        self,
        pod: JSON | None,
        containers: Iterable[ContainerStatusInfo],
        *,
        grace_s: int,
        pod_ip: str,
    ) -> PreStops:
        """Start the preStop hooks of these containers in parallel (those that have one).

        Only running containers get theirs, as upstream kills the pod's running
        containers with hooks: a created or unknown one has no process to run it in.
        """
        tasks: dict[ContainerID, asyncio.Task[float]] = {}
        for c in containers:
            if c.state != ContainerState.RUNNING:
                continue
            spec = container_spec(pod, c.name) if pod is not None else restored_container(c)
            if (spec.get("lifecycle") or {}).get("preStop"):
                tasks[c.id] = asyncio.create_task(
                    self.pre_stop(pod, spec, c.id, budget_s=grace_s, pod_ip=pod_ip),
                    name=f"preStop {c.name}",
                )
        return PreStops(tasks)

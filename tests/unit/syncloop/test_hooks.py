"""Lifecycle hooks against the fake CRI runtime with a fake clock.

Covers postStart (runs right after StartContainer; a failure records
FailedPostStartHook and Killing/FailedPostStartHook, stops the container and leaves it
waiting with PostStartHookError, and a failing restart counts for the crash-loop
back-off), preStop (runs before StopContainer on pod kills, spec-change kills and
orphan kills restored from the container annotation; its time comes off the grace
period with a 2 s floor; a failure records FailedPreStopHook and the stop goes on; the
hooks of several containers run in parallel; a hook is cut off at the grace period),
the `sleep` action bounded by the grace period (counted in
kubelet_sleep_action_terminated_early_total when cut short), httpGet delivery (any HTTP answer
counts; a refused connection fails; an HTTPS hook a plain-HTTP server answers is
delivered over HTTP with the LifecycleHTTPFallback Event and
kubelet_lifecycle_handler_http_fallbacks_total, or fails with Go's scheme-mismatch error
when the HTTP retry is not answered), tcpSocket failing as upstream's invalid handler,
and the grace period chosen from spec, deletion and override.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb
from klet.cri import labels as L
from klet.cri.client import _container_pb
from klet.cri.types import ContainerState
from klet.model.types import ContainerID
from klet.syncloop.containers import hooks
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.model import podspec
from klet.syncloop.pods.syncpod import SyncResult
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import RecordedEvents, pod, wire

IMAGE = "registry.klet.test/busybox:1.36"


class Time:
    """One fake clock for syncloop (seconds) and the runtime (ns); sleeping advances it."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def ns(self) -> int:
        return int(self.t * 1e9)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.time = Time()
        self.cri = FakeRuntimeService(clock=self.time.ns)
        self.cri.add_image(IMAGE, 1_000_000)
        self.events = RecordedEvents()
        deps = wire(
            tmp_path,
            self.cri,
            events=self.events,
            clock=self.time,
            sleep=self.time.sleep,
            sync=SyncSettings(pod_logs_dir=tmp_path / "logs", root_dir=tmp_path / "root"),
        )
        self.registry = deps.registry
        self.syncer = deps.controller.syncer
        self.runtime = self.syncer.runtime
        self.hooks = self.syncer.hooks
        self.execs: list[tuple[str, list[str]]] = []
        self.exec_codes: dict[str, int] = {}  # first command word -> exit code
        self.exec_seconds: dict[str, float] = {}  # first command word -> time it takes
        self.cri.exec_responder = self._exec

    def _exec(self, container_id: ContainerID, cmd: list[str]) -> tuple[int, bytes, bytes]:
        self.execs.append((self.cri.containers[container_id].config.name, cmd))
        self.time.t += self.exec_seconds.get(cmd[0], 0.0)
        code = self.exec_codes.get(cmd[0], 0)
        return code, b"", (b"it broke" if code else b"")

    async def sync(self, p: dict[str, Any]) -> SyncResult:
        return await self.syncer.sync(p, await self.runtime.get(p["metadata"]["uid"]))

    async def kill(self, p: dict[str, Any] | None, uid: str = "u1", **kw: Any) -> None:
        current = await self.runtime.get(uid)
        await self.syncer.kill_pod(p, current, grace_override=kw.get("grace"), remove=False)

    def latest(self, name: str) -> Any:
        return max(
            (c for c in self.cri.containers.values() if c.config.name == name),
            key=lambda c: c.config.attempt,
        )

    def rpcs(self, *names: str) -> list[tuple[str, ...]]:
        return [c for c in self.cri.calls if c[0] in names]


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


def with_hooks(p: dict[str, Any], name: str, **lifecycle: Any) -> dict[str, Any]:
    c = next(c for c in p["spec"]["containers"] if c["name"] == name)
    c["lifecycle"] = lifecycle
    return p


EXEC_TOUCH = {"exec": {"command": ["touch", "/tmp/ready"]}}
EXEC_FAIL = {"exec": {"command": ["false"]}}


# -- postStart ---------------------------------------------------------------------------


async def test_post_start_runs_right_after_the_container_starts(w: World) -> None:
    p = with_hooks(pod("app", "other"), "app", postStart=EXEC_TOUCH)
    result = await w.sync(p)
    assert result.waiting == {}
    app = w.latest("app")
    assert app.state == ContainerState.RUNNING
    assert w.execs == [("app", ["touch", "/tmp/ready"])]
    calls = w.rpcs("StartContainer", "ExecSync")
    # The hook runs before the next container is started (upstream runs it inline).
    assert [c[0] for c in calls] == ["StartContainer", "ExecSync", "StartContainer"]
    assert calls[1][1] == app.id
    assert w.events.of("FailedPostStartHook") == []


async def test_failed_post_start_kills_the_container_and_reports_why(w: World) -> None:
    p = with_hooks(pod("app"), "app", postStart=EXEC_FAIL)
    p["spec"]["terminationGracePeriodSeconds"] = 17
    w.exec_codes["false"] = 1
    result = await w.sync(p)
    app = w.latest("app")
    assert app.state == ContainerState.EXITED
    reason, message = result.waiting["app"]
    assert reason == "PostStartHookError"
    assert message.startswith(
        'Exec lifecycle hook ([false]) for Container "app" in Pod "web-node1_default(u1)" failed'
    )
    assert 'message: "it broke"' in message
    assert w.events.of("FailedPostStartHook") == [
        ("Warning", "FailedPostStartHook", "PostStartHook failed", "spec.containers{app}")
    ]
    assert ("Normal", "Killing", "FailedPostStartHook", "spec.containers{app}") in w.events.records
    assert w.cri.calls_of("StopContainer") == [("StopContainer", app.id, "17")]


async def test_failing_post_start_restarts_then_backs_off(w: World) -> None:
    p = with_hooks(pod("app"), "app", postStart=EXEC_FAIL)
    w.exec_codes["false"] = 1
    await w.sync(p)
    w.time.t += 1
    result = await w.sync(p)  # the first restart is immediate, and fails again
    assert w.latest("app").config.attempt == 1
    assert result.waiting["app"][0] == "PostStartHookError"
    w.time.t += 1
    result = await w.sync(p)
    reason, message = result.waiting["app"]
    assert reason == "CrashLoopBackOff" and "back-off 10s" in message
    assert w.latest("app").config.attempt == 1  # nothing started during the back-off


async def test_post_start_sleep_and_tcp_socket(w: World) -> None:
    p = with_hooks(pod("app", "tcp"), "app", postStart={"sleep": {"seconds": 3}})
    with_hooks(p, "tcp", postStart={"tcpSocket": {"port": 80}})
    result = await w.sync(p)
    assert w.time.slept == [3]
    assert w.latest("app").state == ContainerState.RUNNING and "app" not in result.waiting
    # tcpSocket is deprecated: accepted, but no runner exists for it (upstream fails it).
    reason, message = result.waiting["tcp"]
    assert reason == "PostStartHookError"
    assert message.startswith("Cannot run handler: invalid handler: ")
    assert w.latest("tcp").state == ContainerState.EXITED


# -- preStop -----------------------------------------------------------------------------


async def test_pre_stop_runs_before_the_stop_and_its_time_comes_off_the_grace(w: World) -> None:
    p = with_hooks(pod("app"), "app", preStop={"exec": {"command": ["drain"]}})
    p["spec"]["terminationGracePeriodSeconds"] = 30
    await w.sync(p)
    w.exec_seconds["drain"] = 7.6
    await w.kill(p)
    app = w.latest("app")
    calls = w.rpcs("ExecSync", "StopContainer", "StopPodSandbox")
    assert calls == [
        ("ExecSync", app.id, "drain"),
        ("StopContainer", app.id, "23"),  # 30 - 7 (whole seconds, truncated)
        ("StopPodSandbox", app.sandbox_id),
    ]
    assert app.state == ContainerState.EXITED


@pytest.mark.parametrize(
    ("grace", "seconds", "slept", "stop_timeout"),
    [(30, 10, 10, "20"), (30, 100, 30, "2"), (5, 4, 4, "2"), (3, 0, 0, "3")],
)
async def test_pre_stop_sleep_is_bounded_by_the_grace_period(
    w: World, grace: int, seconds: int, slept: float, stop_timeout: str
) -> None:
    p = with_hooks(pod("app"), "app", preStop={"sleep": {"seconds": seconds}})
    p["spec"]["terminationGracePeriodSeconds"] = grace
    await w.sync(p)
    await w.kill(p)
    assert w.time.slept == [slept]
    assert w.cri.calls_of("StopContainer") == [("StopContainer", w.latest("app").id, stop_timeout)]
    # a sleep the grace period cut short is upstream's "terminated early"
    cut = w.registry.get_sample_value("kubelet_sleep_action_terminated_early_total")
    assert cut == (1 if seconds > grace else 0)


async def test_failed_pre_stop_is_reported_and_the_stop_goes_on(w: World) -> None:
    p = with_hooks(pod("app"), "app", preStop=EXEC_FAIL)
    await w.sync(p)
    w.exec_codes["false"] = 2
    await w.kill(p)
    assert w.events.of("FailedPreStopHook") == [
        ("Warning", "FailedPreStopHook", "PreStopHook failed", "spec.containers{app}")
    ]
    assert w.latest("app").state == ContainerState.EXITED
    assert w.cri.calls_of("StopContainer") == [("StopContainer", w.latest("app").id, "30")]


async def test_pre_stop_hooks_of_a_pod_run_in_parallel(w: World) -> None:
    p = pod("a", "b")
    for name in ("a", "b"):
        with_hooks(p, name, preStop={"exec": {"command": ["drain", name]}})
    await w.sync(p)
    in_flight: set[str] = set()
    both = asyncio.Event()
    names = iter(["first", "second"])

    async def exec_hook() -> None:
        # Each hook waits until the other one has started: serial hooks would deadlock.
        me = next(names)
        in_flight.add(me)
        if len(in_flight) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)

    w.cri.hooks["ExecSync"] = exec_hook
    await w.kill(p)
    assert both.is_set()
    assert [c[0] for c in w.rpcs("ExecSync", "StopContainer")] == [
        "ExecSync",
        "ExecSync",
        "StopContainer",
        "StopContainer",
    ]


async def test_pre_stop_runs_when_a_changed_container_is_replaced(w: World) -> None:
    p = with_hooks(pod("app"), "app", preStop={"exec": {"command": ["drain"]}})
    await w.sync(p)
    old = w.latest("app")
    p["spec"]["containers"][0]["args"] = ["changed"]
    w.cri.calls.clear()
    await w.sync(p)
    calls = w.rpcs("ExecSync", "StopContainer", "CreateContainer")
    assert calls[:2] == [("ExecSync", old.id, "drain"), ("StopContainer", old.id, "30")]
    assert calls[2][0] == "CreateContainer"
    assert w.latest("app").config.attempt == 1


async def test_an_orphan_gets_the_pre_stop_kept_in_its_annotation(w: World) -> None:
    p = with_hooks(pod("app"), "app", preStop={"exec": {"command": ["drain", "now"]}})
    p["spec"]["terminationGracePeriodSeconds"] = 12
    await w.sync(p)
    app = w.latest("app")
    assert L.CONTAINER_PRESTOP_HANDLER in app.config.annotations
    await w.kill(None)  # the spec is gone (removed while syncloop was away)
    assert w.rpcs("ExecSync", "StopContainer") == [
        ("ExecSync", app.id, "drain", "now"),
        ("StopContainer", app.id, "12"),
    ]


async def test_a_pre_stop_that_outlives_the_grace_period_is_cut_off(w: World) -> None:
    p = with_hooks(pod("app"), "app", preStop={"exec": {"command": ["hang"]}})
    await w.sync(p)
    hang = asyncio.Event()

    async def never() -> None:
        await hang.wait()

    w.cri.hooks["ExecSync"] = never
    app = w.latest("app")
    loop = asyncio.get_running_loop()
    start = loop.time()
    elapsed = await w.hooks.pre_stop(p, p["spec"]["containers"][0], app.id, budget_s=0.2, pod_ip="")
    assert 0.15 < loop.time() - start < 2
    assert elapsed == 0  # the fake clock did not move; only real time passed
    assert w.events.of("FailedPreStopHook") == []  # cut short is not a failure upstream


# -- httpGet -----------------------------------------------------------------------------


async def _serve(state: dict[str, Any]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        state["requests"].append(head.decode())
        writer.write(f"HTTP/1.1 {state['status']} X\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_http_pre_stop_counts_any_answer_as_delivered(w: World) -> None:
    http_server: dict[str, Any] = {"requests": [], "status": 500}
    server = await _serve(http_server)
    port = server.sockets[0].getsockname()[1]
    try:
        p = with_hooks(
            pod("app"),
            "app",
            preStop={"httpGet": {"host": "127.0.0.1", "port": port, "path": "/shutdown"}},
        )
        await w.sync(p)
        await w.kill(p)
    finally:
        server.close()
        await server.wait_closed()
    [request] = http_server["requests"]
    assert request.startswith("GET /shutdown HTTP/1.1")
    assert "User-Agent: kube-lifecycle/" in request
    assert w.events.of("FailedPreStopHook") == []  # a 500 still means the hook ran


async def test_http_post_start_fails_when_nobody_listens(w: World) -> None:
    server = await _serve({"requests": [], "status": 200})
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    p = with_hooks(
        pod("app"), "app", postStart={"httpGet": {"host": "127.0.0.1", "port": port, "path": "/x"}}
    )
    result = await w.sync(p)
    reason, message = result.waiting["app"]
    assert reason == "PostStartHookError"
    assert message.startswith('HTTP lifecycle hook (/x) for Container "app"')
    assert "connection refused" in message


async def _serve_plain_http(requests: list[bytes], *, answer_http: bool = True) -> asyncio.Server:
    """A plain-HTTP server: a TLS ClientHello gets Go's 400 Bad Request, an HTTP request
    200 (or, without `answer_http`, the connection closed unanswered)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(1)
        if first == b"\x16":
            writer.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        elif first:
            requests.append(first + await reader.readuntil(b"\r\n\r\n"))
            if answer_http:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def https_hook(port: int) -> dict[str, Any]:
    return {"httpGet": {"host": "127.0.0.1", "port": port, "path": "/started", "scheme": "HTTPS"}}


async def sync_https_post_start(
    w: World, requests: list[bytes], *, answer_http: bool = True
) -> tuple[SyncResult, int]:
    """Sync a pod whose postStart is an HTTPS GET at a plain-HTTP server (its requests
    kept in `requests`), the server closed after; the sync's result and its port."""
    server = await _serve_plain_http(requests, answer_http=answer_http)
    port = server.sockets[0].getsockname()[1]
    try:
        return await w.sync(with_hooks(pod("app"), "app", postStart=https_hook(port))), port
    finally:
        server.close()
        await server.wait_closed()


async def test_https_hook_answered_in_plain_http_falls_back_with_event_and_count(
    w: World,
) -> None:
    requests: list[bytes] = []
    result, port = await sync_https_post_start(w, requests)
    assert result.waiting == {}
    assert w.latest("app").state == ContainerState.RUNNING
    [request] = requests
    assert request.startswith(b"GET /started HTTP/1.1")
    assert w.events.of("LifecycleHTTPFallback") == [
        (
            "Warning",
            "LifecycleHTTPFallback",
            f"request to HTTPS lifecycle hook 127.0.0.1:{port} got HTTP response, "
            "retry with HTTP succeeded",
            "",
        )
    ]
    assert w.registry.get_sample_value("kubelet_lifecycle_handler_http_fallbacks_total") == 1
    assert w.events.of("FailedPostStartHook") == []


async def test_https_hook_whose_http_retry_is_unanswered_fails_with_the_https_error(
    w: World,
) -> None:
    requests: list[bytes] = []
    result, port = await sync_https_post_start(w, requests, answer_http=False)
    reason, message = result.waiting["app"]
    assert reason == "PostStartHookError"
    assert message.endswith(
        f'Get "https://127.0.0.1:{port}/started": http: server gave HTTP response to HTTPS client'
    )
    assert len(requests) == 1  # the retry went out
    assert w.events.of("LifecycleHTTPFallback") == []
    assert w.registry.get_sample_value("kubelet_lifecycle_handler_http_fallbacks_total") == 0


# -- grace periods -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grace", "elapsed", "left"), [(30, 0, 30), (30, 7.9, 23), (30, 29, 2), (2, 5, 2)]
)
def test_remaining_grace(grace: int, elapsed: float, left: int) -> None:
    assert hooks.remaining_grace(grace, elapsed) == left


@pytest.mark.parametrize(
    ("deletion", "override", "grace"),
    [(None, None, 45), (10, None, 10), (None, 60, 60), (10, 60, 10), (10, 3, 3), (0, None, 2)],
)
def test_deletion_and_override_only_shorten(
    deletion: int | None, override: int | None, grace: int
) -> None:
    meta = {} if deletion is None else {"deletionGracePeriodSeconds": deletion}
    p = {"metadata": meta, "spec": {"terminationGracePeriodSeconds": 45}}
    assert podspec.grace_period_s(p, override) == grace


# -- what the container is created with ---------------------------------------------------


async def test_the_container_gets_its_message_file_and_stop_signal(
    w: World, tmp_path: Path
) -> None:
    p = with_hooks(pod("app"), "app", stopSignal="SIGRTMIN+1")
    await w.sync(p)
    config = w.latest("app").config
    [mount] = [m for m in config.mounts if m.container_path != "/etc/hosts"]
    assert mount.container_path == "/dev/termination-log"
    assert Path(mount.host_path).parent == tmp_path / "root" / "pods" / "u1" / "containers" / "app"
    assert config.stop_signal == "SIGRTMIN+1"
    assert _container_pb(config).stop_signal == pb.Signal.SIGRTMINPLUS1
    # No stopSignal in the spec: the runtime keeps the image's (RUNTIME_DEFAULT).
    assert _container_pb(replace(config, stop_signal="")).stop_signal == pb.Signal.RUNTIME_DEFAULT
    # The pod's files go when the pod is removed for good.
    await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=None, remove=True)
    assert not (tmp_path / "root" / "pods" / "u1").exists()

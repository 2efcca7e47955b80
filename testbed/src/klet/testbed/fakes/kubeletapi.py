"""Stateful fakes of the kubelet API's dependencies, for unit tests.

- `FakePodView`: a PodList held in memory.
- `FakeRuntime`: sandboxes, containers and their stats as lists a test edits, streaming
  calls that answer a configurable URL and record what they were asked, and a switch to
  make any call fail with a given CRIError.
- `FakeApiServer`: answers TokenReview from a token table and SubjectAccessReview from
  a set of allowed (user, verb, subresource) triples, recording every review; `fail`
  makes calls raise Unavailable.
- `FakeCheck`: a health check whose answer a test sets (`result`: None passes, a
  string fails with that reason), counting its runs.
- `FollowerClock`: the clock of a followed log (`FollowPolicy(sleep=clock.sleep)`): its
  polls happen when the test moves the time on, not when the wall clock does.

mypy checks them against the protocols at the bottom. Integration tests use the real
runtime and apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from klet.cri.errors import CRIError, NotFound
from klet.cri.types import (
    Container,
    ContainerStatsInfo,
    ContainerStatusInfo,
    FilesystemUsageInfo,
    Sandbox,
)
from klet.kube import Unavailable
from klet.model.types import JSON, ContainerID, SandboxID
from klet.status_reporter.kubeletapi.authn import TOKENREVIEWS, ApiServer
from klet.status_reporter.kubeletapi.authz import SUBJECTACCESSREVIEWS
from klet.status_reporter.kubeletapi.deps import KubeletRuntime, PodView
from klet.status_reporter.kubeletapi.healthchecks import Check


class FakePodView:
    def __init__(self, pods: list[JSON] | None = None) -> None:
        self.pods = list(pods or [])

    def pod_list(self) -> JSON:
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(self.pods)}


def _selected(labels: dict[str, str], selector: dict[str, str] | None) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


class FakeRuntime:
    def __init__(self) -> None:
        self.sandboxes: list[Sandbox] = []
        self.containers: list[Container] = []
        self.statuses: dict[str, ContainerStatusInfo] = {}
        self.stats: list[ContainerStatsInfo] = []
        self.image_fs: list[FilesystemUsageInfo] = []
        self.stream_url = "http://127.0.0.1:1/stream"
        self.exec_output = (0, b"", b"")
        self.calls: list[tuple[str, Any]] = []
        self.failing: dict[str, CRIError] = {}
        # checkpoint_container's archives: location -> (container ID, timeout sent)
        self.checkpoints: dict[str, tuple[ContainerID, int]] = {}

    def _enter(self, method: str, args: Any = None) -> None:
        self.calls.append((method, args))
        if method in self.failing:
            raise self.failing[method]

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None
    ) -> list[Sandbox]:
        self._enter("list_pod_sandboxes", label_selector)
        return [s for s in self.sandboxes if _selected(s.labels, label_selector)]

    async def list_containers(
        self, *, sandbox_id: SandboxID | None = None, label_selector: dict[str, str] | None = None
    ) -> list[Container]:
        self._enter("list_containers", label_selector)
        return [
            c
            for c in self.containers
            if _selected(c.labels, label_selector) and sandbox_id in (None, c.sandbox_id)
        ]

    async def container_status(self, container_id: ContainerID) -> ContainerStatusInfo:
        self._enter("container_status", container_id)
        if container_id not in self.statuses:
            raise NotFound(f"container {container_id} not found", code="NOT_FOUND")
        return self.statuses[container_id]

    async def exec(
        self,
        container_id: ContainerID,
        cmd: list[str],
        *,
        tty: bool = False,
        stdin: bool = False,
        stdout: bool = True,
        stderr: bool = True,
    ) -> str:
        self._enter("exec", (container_id, cmd, tty, stdin, stdout, stderr))
        return self.stream_url

    async def attach(
        self,
        container_id: ContainerID,
        *,
        tty: bool = False,
        stdin: bool = False,
        stdout: bool = True,
        stderr: bool = True,
    ) -> str:
        self._enter("attach", (container_id, tty, stdin, stdout, stderr))
        return self.stream_url

    async def port_forward(self, sandbox_id: SandboxID, ports: list[int] | None = None) -> str:
        self._enter("port_forward", (sandbox_id, list(ports or [])))
        return self.stream_url

    async def exec_sync(
        self, container_id: ContainerID, cmd: list[str], *, timeout_s: int
    ) -> tuple[int, bytes, bytes]:
        self._enter("exec_sync", (container_id, cmd))
        return self.exec_output

    async def checkpoint_container(
        self, container_id: ContainerID, location: str, *, timeout_s: int = 0
    ) -> None:
        self._enter("checkpoint_container", (container_id, location, timeout_s))
        self.checkpoints[location] = (container_id, timeout_s)

    async def list_container_stats(self) -> list[ContainerStatsInfo]:
        self._enter("list_container_stats")
        return list(self.stats)

    async def image_fs_info(
        self,
    ) -> tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]:
        self._enter("image_fs_info")
        return list(self.image_fs), []


class FakeApiServer:
    def __init__(self) -> None:
        self.tokens: dict[str, JSON] = {}
        """token -> the TokenReview status.user it authenticates as."""
        self.allowed: set[tuple[str, str, str]] = set()
        """(user, verb, subresource) triples SubjectAccessReview allows."""
        self.reviews: list[tuple[str, JSON]] = []
        self.fail = False
        self.hold: asyncio.Event | None = None
        """When set, every review waits for this event before it is answered (a slow
        apiserver); `waiting` counts the reviews held."""
        self.waiting = 0

    async def create(self, path: str, body: JSON) -> Any:
        self.reviews.append((path, body))
        if self.hold is not None:
            self.waiting += 1
            try:
                await self.hold.wait()
            finally:
                self.waiting -= 1
        if self.fail:
            raise Unavailable(f"POST {path}: connection refused")
        spec = body["spec"]
        if path == TOKENREVIEWS:
            user = self.tokens.get(spec["token"])
            status: JSON = {"authenticated": user is not None}
            if user is not None:
                status["user"] = user
            return {**body, "status": status}
        if path == SUBJECTACCESSREVIEWS:
            ra = spec["resourceAttributes"]
            ok = (spec["user"], ra["verb"], ra["subresource"]) in self.allowed
            return {**body, "status": {"allowed": ok}}
        raise AssertionError(f"fake apiserver: no handler for POST {path}")


class FollowerClock:
    """A fake clock for log followers: `sleep` returns only when `advance` moves the time
    past its end. `advance(s)` wakes the due sleeps one at a time, each time waiting until
    the woken follower sleeps again (or `task`, the follower, ends), so afterwards the
    follower has made exactly the polls `s` seconds would have given it. `sleeping`
    counts followers inside `sleep`: 0 once every follower stopped. Without `task`,
    `advance` wakes only the followers sleeping at the time (wait with `until` first)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeping = 0
        self.sleeps = 0  # calls of sleep so far
        self._due: list[tuple[float, asyncio.Event]] = []
        self._changed = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        entry = (self.now + seconds, asyncio.Event())
        self._due.append(entry)
        self.sleeps += 1
        self.sleeping += 1
        self._changed.set()
        try:
            await entry[1].wait()
        finally:
            self.sleeping -= 1
            with contextlib.suppress(ValueError):
                self._due.remove(entry)
            self._changed.set()

    async def advance(self, seconds: float, task: asyncio.Task[Any] | None = None) -> None:
        target = self.now + seconds
        if task is not None:
            await self.until(lambda: self.sleeping > 0, task)
        while self._due and not (task and task.done()):
            end, woken = min(self._due, key=lambda d: d[0])
            if end > target:
                break
            self._due.remove((end, woken))
            self.now = end

            def slept_again(before: int = self.sleeps) -> bool:
                return self.sleeps > before

            woken.set()
            await self.until(slept_again, task)
        self.now = max(self.now, target)

    async def finish(self, task: asyncio.Task[Any], *, step_s: float = 1.0) -> None:
        """Move the time on, `step_s` at a time, until the follower `task` ends."""
        while not task.done():
            await self.advance(step_s, task)
        await task

    async def until(
        self,
        condition: Callable[[], bool],
        task: asyncio.Task[Any] | None = None,
        timeout_s: float = 10,
    ) -> None:
        """Until `condition()` holds or `task` ended; `timeout_s` only guards a broken test."""
        async with asyncio.timeout(timeout_s):
            while not condition() and not (task and task.done()):
                self._changed.clear()
                waiter = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait(
                        [waiter, *([task] if task else [])], return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter


class FakeCheck:
    def __init__(self, result: str | None = None) -> None:
        self.result = result
        self.runs = 0

    async def __call__(self) -> str | None:
        self.runs += 1
        return self.result


def _conforms(
    p: FakePodView, r: FakeRuntime, a: FakeApiServer, c: FakeCheck
) -> tuple[PodView, KubeletRuntime, ApiServer, Check]:
    return p, r, a, c

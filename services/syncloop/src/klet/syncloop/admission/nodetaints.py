"""The Node's taints as syncloop last saw them, for admission (cluster mode).

Upstream's kubelet admits pods against its Node from an informer (a list + watch of
`metadata.name=<node>`), falling back to the node it would register (`initialNode`:
registerWithTaints) while the informer has nothing. `NodeTaints` does the same: it
starts from `registerWithTaints`, reads the Node, then watches it from that
resourceVersion and keeps `spec.taints` of each ADDED/MODIFIED event, so a taint an
operator adds is in force for the next pod within the watch's latency. A watch the
server ends is started again from the last resourceVersion; 410 Gone (compacted) reads
the Node again. A Node that does not exist yet (status-reporter registers it) or was
deleted counts as the initial node. An apiserver that does not answer is retried with
upstream's reflector back-off (0.8 s doubling to 30 s), logged once per outage; the
last taints seen stay in force meanwhile, so an outage neither admits pods a taint
keeps out nor rejects pods by taints that were removed since.

Each change of the taints is logged (INFO, "node taints changed" with the taints), so an
operator, and the cluster test, can see when a taint reached admission.

The Node authorizer lets a node get, list and watch its own Node only (the watch with
the `metadata.name` field selector); `NodeApi` is what this module consumes,
`KubeNodeApi` its implementation over `klet.kube`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from klet.kube import Gone, KubeError, NotFound, WatchEvent
from klet.model.flowcontrol import BackoffPolicy
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.retry import call_retrying

if TYPE_CHECKING:
    from klet.kube.client import KubeClient

log = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
INITIAL_BACKOFF_S = 0.8
MAX_BACKOFF_S = 30.0
REFLECTOR_BACKOFF = BackoffPolicy(INITIAL_BACKOFF_S, MAX_BACKOFF_S)
"""Retries of a read or watch the apiserver did not answer (through `klet.retry`)."""
WATCH_TIMEOUT_S = 300  # upstream's reflector: 5 to 10 minutes, at random
SHORT_WATCH_S = 1.0  # a watch ended this soon without events is not restarted at once


class NodeApi(Protocol):
    """This node's Node: read, and watched from a resourceVersion."""

    async def get_node(self) -> JSON: ...

    def watch_node(self, resource_version: str) -> AsyncIterator[WatchEvent]: ...


class KubeNodeApi:
    """`NodeApi` over the apiserver client."""

    def __init__(self, client: KubeClient, node_name: str) -> None:
        self._client = client
        self._name = node_name

    async def get_node(self) -> JSON:
        node = await self._client.get(f"{NODES_PATH}/{self._name}")
        if not isinstance(node, dict):
            raise KubeError(f"GET {NODES_PATH}/{self._name}: not an object")
        return node

    def watch_node(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        return self._client.watch(
            NODES_PATH,
            resource_version=resource_version,
            timeout_s=random.randint(WATCH_TIMEOUT_S, 2 * WATCH_TIMEOUT_S),
            fieldSelector=f"metadata.name={self._name}",
        )


def node_taints(node: JSON) -> tuple[JSON, ...]:
    """The Node's spec.taints (the mappings among them)."""
    taints = (node.get("spec") or {}).get("taints") or []
    return tuple(t for t in taints if isinstance(t, dict)) if isinstance(taints, list) else ()


class NodeTaints:
    """The taints admission reads (`taints()`), kept current by `run()`."""

    def __init__(
        self,
        api: NodeApi,
        *,
        initial: Iterable[Mapping[str, Any]] = (),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._initial = tuple(dict(t) for t in initial)
        self._taints = self._initial
        self._rv: str | None = None
        self._sleep = sleep
        self._errors = OnceLogger(log, level=logging.WARNING)

    def taints(self) -> tuple[JSON, ...]:
        return self._taints

    async def run(self) -> None:
        """Read, then watch, the Node until cancelled."""
        while True:
            pause = await call_retrying(
                self.step,
                REFLECTOR_BACKOFF,
                on=(KubeError, ValueError),
                before_wait=self._failed,
                sleep=self._sleep,
            )
            if pause > 0:
                await self._sleep(pause)

    def _failed(self, err: BaseException | None, wait_s: float) -> None:
        self._errors.error(
            "node",
            "cannot read the Node for admission's taints; keeping the last seen",
            cause=str(err),
            error=str(err),
            retry_s=wait_s,
        )

    async def step(self) -> float:
        """One read (without a resourceVersion) or one watch; the pause before the next.

        Raises KubeError (the apiserver down, refusing) for `run` to back off."""
        if self._rv is None:
            try:
                node = await self._api.get_node()
            except NotFound:
                self._set(self._initial, why="the Node does not exist yet")
                self._errors.clear("node", "the Node can be read again")
                return INITIAL_BACKOFF_S
            self._errors.clear("node", "the Node can be read again")
            self._rv = str((node.get("metadata") or {}).get("resourceVersion") or "") or None
            self._set(node_taints(node), why="read")
            return 0.0 if self._rv is not None else INITIAL_BACKOFF_S
        events = 0
        stream = self._api.watch_node(self._rv)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async for event in stream:
                events += 1
                self._apply(event)
        except Gone:
            self._rv = None
            return 0.0
        finally:
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()
        self._errors.clear("node", "the Node can be read again")
        if events == 0 and loop.time() - started < SHORT_WATCH_S:
            return SHORT_WATCH_S
        return 0.0

    def _apply(self, event: WatchEvent) -> None:
        rv = (event.object.get("metadata") or {}).get("resourceVersion")
        if rv:
            self._rv = str(rv)
        if event.type in ("ADDED", "MODIFIED"):
            self._set(node_taints(event.object), why=event.type)
        elif event.type == "DELETED":
            self._set(self._initial, why="the Node was deleted")

    def _set(self, taints: tuple[JSON, ...], *, why: str) -> None:
        if taints == self._taints:
            return
        self._taints = taints
        log.info("node taints changed", extra={"taints": list(taints), "why": why})

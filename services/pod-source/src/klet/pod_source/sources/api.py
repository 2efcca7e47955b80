"""The apiserver source (cluster mode, `--kubeconfig`): this node's pods, list + watch.

A small reflector, as upstream's (client-go Reflector + UndeltaStore feeding PodConfig a
full SET on every change):

1. List `/api/v1/pods?fieldSelector=spec.nodeName=<node>` in all namespaces: the full
   set (a snapshot) and its `resourceVersion`.
2. Watch from that resourceVersion; each ADDED/MODIFIED/DELETED event changes the
   in-memory set and offers a new snapshot (the inbox keeps only the newest, so a burst
   of events is merged once); BOOKMARK only moves the resourceVersion.
3. A watch the server ends (its timeout) is started again from the last
   resourceVersion. 410 Gone (the resourceVersion was compacted) means relist at once:
   the new list is a full SET, so pods deleted during the gap get their REMOVE.
4. An apiserver that does not answer (or refuses us) is retried with exponential
   back-off, the watch from the last resourceVersion (no relist needed when it comes
   back quickly), logged once per outage. Nothing is offered while it is down: the
   merge keeps the last good set, and a source never listed stays not ready, so the
   pods the previous run published are not removed.

Which objects count and how they are shaped is decided in `apipods` (pure); this
module is the I/O shell. `PodApi` is the interface it consumes (list, watch) and
`KubePodApi` its implementation over `klet.kube`; the unit tests use
`klet.testbed.fakes.podapi.FakePodApi`.

Trade-off: the apiserver's watch cache answers the relist after an outage with a full
list; upstream's newer streaming lists and consistent reads from cache are not used,
since a node's pods are few (maxPods, 110 by default).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from klet.kube import Forbidden, Gone, KubeError, Unavailable, WatchEvent
from klet.model.records import SourceName
from klet.model.types import JSON
from klet.obs import OnceLogger
from klet.pod_source import apipods
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import Metrics
from klet.pod_source.publisher import RetryPolicy

if TYPE_CHECKING:
    from klet.kube.client import KubeClient

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"

# Upstream's reflector back-off: 800 ms doubling to 30 s.
DEFAULT_RETRY = RetryPolicy(initial_s=0.8, max_s=30.0, factor=2.0)

# Upstream's reflector asks for watches of 5 to 10 minutes (random, so that many
# clients do not rewatch together).
MIN_WATCH_TIMEOUT_S = 300

# A watch the server ends this soon without a single event is not restarted at once:
# a misbehaving server (or proxy) that closes every watch must not make us spin.
SHORT_WATCH_S = 1.0


@dataclass(frozen=True)
class PodList:
    """One list answer: the items and the resourceVersion to watch from."""

    items: list[JSON]
    resource_version: str


class PodApi(Protocol):
    """What the source needs of the apiserver: this node's pods, listed and watched."""

    async def list_pods(self) -> PodList: ...

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]: ...

    async def close(self) -> None: ...


class KubePodApi:
    """`PodApi` over `klet.kube.KubeClient`, with the node's field selector."""

    def __init__(
        self, client: KubeClient, *, node_name: str, watch_timeout_s: int = MIN_WATCH_TIMEOUT_S
    ) -> None:
        self._client = client
        self._selector = f"spec.nodeName={node_name}"
        self._watch_timeout_s = watch_timeout_s

    async def list_pods(self) -> PodList:
        body = await self._client.get(PODS_PATH, fieldSelector=self._selector)
        items = body.get("items") if isinstance(body, dict) else None
        rv = apipods.resource_version(body)
        if not isinstance(items, list) or rv is None:
            raise KubeError(f"GET {PODS_PATH}: not a PodList with a resourceVersion")
        return PodList(items=items, resource_version=rv)

    def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        timeout_s = random.randint(self._watch_timeout_s, 2 * self._watch_timeout_s)
        return self._client.watch(
            PODS_PATH,
            resource_version=resource_version,
            timeout_s=timeout_s,
            fieldSelector=self._selector,
        )

    async def close(self) -> None:
        await self._client.close()


class ApiSource:
    """Lists then watches this node's pods; offers the set after every change."""

    def __init__(
        self,
        *,
        api: PodApi,
        node_name: str,
        inbox: Inbox,
        metrics: Metrics,
        retry: RetryPolicy = DEFAULT_RETRY,
        short_watch_s: float = SHORT_WATCH_S,
    ) -> None:
        self._api = api
        self._node_name = node_name
        self._inbox = inbox
        self._metrics = metrics
        self._retry = retry
        self._short_watch_s = short_watch_s
        self._pods: dict[str, JSON] = {}
        self._rv: str | None = None  # None: list next
        self._listed = False
        self._failures = 0
        self._once = OnceLogger(log, level=logging.WARNING)
        # Skipped (uid, reason) already logged; reset at every list, so it stays small.
        self._reported: set[tuple[str, str]] = set()

    @property
    def name(self) -> SourceName:
        return "api"

    @property
    def pods(self) -> dict[str, JSON]:
        """The current set by UID (a copy)."""
        return dict(self._pods)

    @property
    def resource_version(self) -> str | None:
        return self._rv

    @property
    def listed(self) -> bool:
        """Whether a list succeeded at least once (the source delivered a snapshot)."""
        return self._listed

    async def run(self) -> None:
        try:
            while True:
                delay = await self.run_once()
                if delay > 0:
                    await asyncio.sleep(delay)
        finally:
            await self._api.close()

    async def run_once(self) -> float:
        """One list, or one watch until it ends; returns the seconds to wait before the next."""
        listing = self._rv is None
        try:
            if listing:
                await self._list()
                return 0.0
            return await self._watch()
        except Gone as err:
            self._metrics.api_watch_errors.labels(reason="expired").inc()
            if listing:  # only a list from a resourceVersion can expire; ours has none
                return self._failed(err)
            log.info(
                "watch of this node's pods expired; relisting",
                extra={"resource_version": self._rv, "error": str(err)},
            )
            self._rv = None
            return 0.0
        except (KubeError, ValueError) as err:
            self._metrics.api_watch_errors.labels(reason=_reason(err)).inc()
            return self._failed(err)

    # -- steps ---------------------------------------------------------------

    async def _list(self) -> None:
        if self._listed:
            self._metrics.api_relists.inc()
        answer = await self._api.list_pods()
        pods, skipped = apipods.from_list(answer.items, node_name=self._node_name)
        self._recovered()
        self._reported.clear()
        for s in skipped:
            self._report(s)
        self._pods = pods
        self._rv = answer.resource_version
        log.info(
            "relisted this node's pods" if self._listed else "listed this node's pods",
            extra={"pods": len(pods), "resource_version": self._rv},
        )
        self._listed = True
        self._offer()

    async def _watch(self) -> float:
        assert self._rv is not None
        started = time.monotonic()
        events = 0
        stream = self._api.watch_pods(self._rv)
        try:
            async for event in stream:
                if events == 0:
                    self._recovered()
                events += 1
                self._apply(event)
        finally:
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()  # stops the request now, not when collected
        self._metrics.api_watches.inc()
        self._recovered()
        if events == 0 and time.monotonic() - started < self._short_watch_s:
            return self._short_watch_s
        return 0.0

    def _apply(self, event: WatchEvent) -> None:
        rv = apipods.resource_version(event.object)
        if rv is not None:
            self._rv = rv
        if event.type == apipods.BOOKMARK:
            self._inbox.polled()  # lets the publisher check the tables now and then
            return
        if event.type not in (apipods.ADDED, apipods.MODIFIED, apipods.DELETED):
            log.debug("watch event ignored", extra={"type": event.type})
            return
        pods, skipped = apipods.apply_event(
            self._pods, event.type, event.object, node_name=self._node_name
        )
        if skipped is not None:
            self._report(skipped)
        if pods is not None:
            self._pods = pods
            self._offer()

    def _offer(self) -> None:
        self._metrics.snapshots.labels(source="api").inc()
        self._inbox.offer("api", list(self._pods.values()))

    # -- bookkeeping ---------------------------------------------------------

    def _failed(self, err: Exception) -> float:
        """Keep the set; log the error once per outage (and per change of error)."""
        self._failures += 1
        delay = self._retry.delay(self._failures)
        fields = {"error": str(err), "retry_in_s": delay, "listed": self._listed}
        if not self._once.error(
            "apiserver",
            "apiserver pod source failing; keeping the last pod set",
            cause=(type(err), getattr(err, "status", 0)),
            level=logging.ERROR if isinstance(err, Forbidden) else logging.WARNING,
            **fields,
        ):
            log.debug("apiserver pod source still failing", extra=fields)
        return delay

    def _recovered(self) -> None:
        self._once.clear("apiserver", "apiserver pod source working again", failures=self._failures)
        self._failures = 0

    def _report(self, skipped: apipods.Skipped) -> None:
        fields = {"pod": skipped.full_name, "uid": skipped.uid, "reason": skipped.reason}
        if skipped.reason == apipods.SKIP_MIRROR:
            log.debug("mirror pod skipped", extra=fields)  # expected: one per static pod
            return
        key = (skipped.uid, skipped.reason)
        if key in self._reported:
            return
        self._reported.add(key)
        self._metrics.manifest_errors.labels(source="api", reason="invalid").inc()
        log.warning("apiserver pod skipped", extra=fields)


def _reason(err: Exception) -> str:
    if isinstance(err, Unavailable):
        return "unavailable"
    if isinstance(err, Forbidden):
        return "forbidden"
    return "other"

"""A stateful fake of `klet.pod_source.sources.api.PodApi` for unit tests (STYLE.md rule 7).

It keeps what an apiserver keeps for the pods of one list/watch: the objects, a
resourceVersion counter and the event history, so a watch from resourceVersion N
yields every change after N and then ends (as a server-side watch timeout does).
`compact()` makes older resourceVersions expire (410 Gone), `delete(grace=...)` is a
graceful deletion (a MODIFIED event that sets the deletion fields, the object stays)
and `delete()` removes the object (DELETED). Errors are injected per call, and every
call is logged in `calls`.

It does not apply a field selector: every pod it holds is listed and watched, which
lets tests check that the source itself refuses another node's pods.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import AsyncIterator

from klet.kube import Gone, WatchEvent
from klet.model.types import JSON
from klet.pod_source.sources.api import PodList

DELETION_TIMESTAMP = "2024-01-01T00:00:00Z"


class FakePodApi:
    """Pods, a resourceVersion counter and the event history; see the module doc."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {}
        self.rv = 1
        self.history: list[WatchEvent] = []
        self.compacted = 0  # watches from a resourceVersion below this get 410 Gone
        self.list_errors: list[Exception] = []  # raised by the next lists, in order
        self.watch_errors: list[Exception] = []  # raised by the next watches as they start
        self.break_watch: Exception | None = None  # ends the next watch after its events
        self.calls: list[str] = []
        self.closed = False
        self._uids = itertools.count(1)

    # -- what tests do to the "cluster" ---------------------------------------

    def create(self, pod: JSON) -> JSON:
        """Store `pod` (a UID is assigned when it has none); returns the stored copy."""
        obj = copy.deepcopy(pod)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"api-uid-{next(self._uids)}")
        meta.setdefault("namespace", "default")
        return self._record("ADDED", obj)

    def update(self, pod: JSON) -> JSON:
        obj = copy.deepcopy(pod)
        if obj["metadata"]["uid"] not in self.pods:
            raise KeyError(obj["metadata"]["uid"])
        return self._record("MODIFIED", obj)

    def delete(self, uid: str, *, grace: int | None = None) -> JSON:
        """Graceful (`grace` set: the object stays, being deleted) or final deletion."""
        obj = copy.deepcopy(self.pods[uid])
        if grace is not None:
            obj["metadata"]["deletionTimestamp"] = DELETION_TIMESTAMP
            obj["metadata"]["deletionGracePeriodSeconds"] = grace
            return self._record("MODIFIED", obj)
        return self._record("DELETED", obj)

    def bookmark(self) -> None:
        self.rv += 1
        self.history.append(
            WatchEvent("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": str(self.rv)}})
        )

    def compact(self) -> None:
        """Every resourceVersion handed out so far expires."""
        self.compacted = self.rv + 1

    # -- PodApi -----------------------------------------------------------------

    async def list_pods(self) -> PodList:
        self.calls.append("list")
        if self.list_errors:
            raise self.list_errors.pop(0)
        items = [copy.deepcopy(p) for p in self.pods.values()]
        for item in items:  # list items carry no kind/apiVersion, as the apiserver's
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return PodList(items=items, resource_version=str(self.rv))

    async def watch_pods(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        self.calls.append(f"watch {resource_version}")
        if self.watch_errors:
            raise self.watch_errors.pop(0)
        since = int(resource_version)
        if since < self.compacted:
            raise Gone(f"too old resource version: {since} ({self.compacted})", status=410)
        for event in list(self.history):
            if int(event.object["metadata"]["resourceVersion"]) > since:
                yield WatchEvent(event.type, copy.deepcopy(event.object))
        if self.break_watch is not None:
            err, self.break_watch = self.break_watch, None
            raise err

    async def close(self) -> None:
        self.closed = True

    # -- internals ----------------------------------------------------------------

    def _record(self, event_type: str, obj: JSON) -> JSON:
        self.rv += 1
        obj["apiVersion"], obj["kind"] = "v1", "Pod"
        obj["metadata"]["resourceVersion"] = str(self.rv)
        uid = obj["metadata"]["uid"]
        if event_type == "DELETED":
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = obj
        self.history.append(WatchEvent(event_type, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

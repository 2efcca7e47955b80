"""Runtime events: the adapter syncloop's evented PLEG subscribes through.

Two sources, tried in this order on every subscription:

- CRI `GetContainerEvents` (containerd 1.7+, CRI-O). A runtime without it answers
  UNIMPLEMENTED at once; that answer is remembered for the life of the client.
- containerd's own events service (`containerd.services.events.v1.Events/Subscribe`)
  on the same socket, which containerd 1.6 serves although its CRI plugin has no
  events. The subscription asks for the task topics of the CRI namespace only. A task's
  `container_id` is the CRI container ID (or, for the pause task, the sandbox ID).
  These events are published before the CRI plugin has updated its own view of the
  container, so the consumer must confirm a change through CRI before acting on it.

`subscribe()` yields `Subscribed` once the runtime answered a Version call and the
stream was requested, then `RuntimeEvent`s. Neither API confirms when the runtime has
registered the subscription, so an event in the first milliseconds of a stream can
be missed; the caller's full relist right after `Subscribed` (and its periodic relist)
covers that. It ends
by raising `RuntimeUnavailable` when the stream drops (the runtime restarted) and
`EventsUnsupported` when neither source exists; re-subscribing and catching up is the
caller's business. gRPC channels back off reconnecting for up to two minutes by
default; this one is capped at `reconnect_max_s` so a restarted runtime is
re-subscribed within seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as cri_pb
from cri_api.v1 import api_pb2_grpc as cri_grpc
from klet.cancellation import raise_if_cancelled
from klet.cri.client import CRISettings
from klet.cri.endpoint import channel_target
from klet.cri.errors import CRIError, EventsUnsupported, RuntimeUnavailable
from klet.cri.labels import POD_UID
from klet.cri.types import EventKind, RuntimeEvent, Subscribed
from klet.rpc.gen.klet.containerd.v1 import events_pb2, events_pb2_grpc, task_pb2

log = logging.getLogger(__name__)

CRI_NAMESPACE = "k8s.io"
"""The containerd namespace the CRI plugin keeps its sandboxes and containers in."""


TASK_TOPICS: dict[str, EventKind] = {
    "/tasks/start": EventKind.STARTED,
    "/tasks/exit": EventKind.EXITED,
    "/tasks/oom": EventKind.OOM,
    "/tasks/delete": EventKind.DELETED,
}


def subscribe_filters(namespace: str = CRI_NAMESPACE) -> list[str]:
    """containerd filters (ORed) for the task topics of `namespace`."""
    return [f'namespace=="{namespace}",topic=="{topic}"' for topic in TASK_TOPICS]


def _seconds(ts: Any) -> float:
    return float(ts.seconds) + float(ts.nanos) / 1e9


_PAYLOADS: dict[str, type[Any]] = {
    "/tasks/start": task_pb2.TaskStart,
    "/tasks/exit": task_pb2.TaskExit,
    "/tasks/oom": task_pb2.TaskOOM,
    "/tasks/delete": task_pb2.TaskDelete,
}


def decode_envelope(env: Any, *, namespace: str = CRI_NAMESPACE) -> RuntimeEvent | None:
    """The event of one containerd Envelope, or None when it is not one syncloop uses:
    another namespace or topic, an undecodable payload, or the exit or deletion of an
    exec'd process (probes and `kubectl exec` run those; their container lives on)."""
    kind = TASK_TOPICS.get(env.topic)
    payload_type = _PAYLOADS.get(env.topic)
    if kind is None or payload_type is None or env.namespace != namespace:
        return None
    name = payload_type.DESCRIPTOR.full_name
    if not env.event.type_url.endswith(name):
        return None
    payload = payload_type()
    try:
        payload.ParseFromString(env.event.value)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError; a bad payload is skipped
        log.debug("undecodable runtime event", extra={"topic": env.topic})
        return None
    if not payload.container_id:
        return None
    exit_status: int | None = None
    at = _seconds(env.timestamp)
    if kind in (EventKind.EXITED, EventKind.DELETED):
        if payload.id and payload.id != payload.container_id:
            return None  # an exec'd process, not the container's init
        exit_status = int(payload.exit_status)
        if payload.HasField("exited_at"):
            at = _seconds(payload.exited_at)
    return RuntimeEvent(
        kind=kind,
        object_id=payload.container_id,
        topic=env.topic,
        exit_status=exit_status,
        at=at,
    )


_CRI_KINDS = {
    "CONTAINER_CREATED_EVENT": EventKind.CREATED,
    "CONTAINER_STARTED_EVENT": EventKind.STARTED,
    "CONTAINER_STOPPED_EVENT": EventKind.EXITED,
    "CONTAINER_DELETED_EVENT": EventKind.DELETED,
}


def decode_cri_event(r: Any) -> RuntimeEvent | None:
    """The event of one CRI ContainerEventResponse."""
    kind = _CRI_KINDS.get(cri_pb.ContainerEventType.Name(r.container_event_type))
    if kind is None or not r.container_id:
        return None
    uid = ""
    if r.HasField("pod_sandbox_status"):
        s = r.pod_sandbox_status
        uid = s.labels.get(POD_UID, "") or s.metadata.uid
    return RuntimeEvent(
        kind=kind,
        object_id=r.container_id,
        topic=f"cri/{kind.value}",
        pod_uid=uid,
        at=r.created_at / 1e9 if r.created_at else 0.0,
    )


class RuntimeEvents:
    """Subscriptions to one runtime's events, on a channel of their own."""

    def __init__(
        self,
        settings: CRISettings,
        *,
        namespace: str = CRI_NAMESPACE,
        reconnect_max_s: float = 1.0,
        ping_timeout_s: float = 5.0,
        probe_s: float = 1.0,
    ) -> None:
        self.namespace = namespace
        self.ping_timeout_s = ping_timeout_s
        self.probe_s = probe_s
        ms = max(100, int(reconnect_max_s * 1000))
        self._channel = grpc.aio.insecure_channel(
            channel_target(settings.runtime_endpoint),
            options=[
                ("grpc.initial_reconnect_backoff_ms", min(100, ms)),
                ("grpc.min_reconnect_backoff_ms", min(100, ms)),
                ("grpc.max_reconnect_backoff_ms", ms),
            ],
        )
        self._cri = cri_grpc.RuntimeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._containerd = events_pb2_grpc.EventsStub(self._channel)  # type: ignore[no-untyped-call]
        self._cri_events: bool | None = None  # unknown until the runtime answered once

    async def close(self) -> None:
        await self._channel.close(None)

    async def subscribe(self) -> AsyncIterator[RuntimeEvent | Subscribed]:
        # A stream call does not fail until its first read, and a Go server sends no
        # response headers before its first event: a unary call first proves the
        # runtime answers, so `Subscribed` is not announced to a runtime that is down.
        await self._ping()
        if self._cri_events is not False:
            try:
                async for item in self._subscribe_cri():
                    yield item
                return
            except EventsUnsupported:
                self._cri_events = False
        async for item in self._subscribe_containerd():
            yield item

    async def _ping(self) -> None:
        try:
            await self._cri.Version(
                cri_pb.VersionRequest(version="v1"), timeout=self.ping_timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise _stream_error(err, "Version") from err

    async def _subscribe_cri(self) -> AsyncIterator[RuntimeEvent | Subscribed]:
        call = self._cri.GetContainerEvents(cri_pb.GetEventsRequest())
        first: asyncio.Task[Any] = asyncio.ensure_future(call.read())
        try:
            if self._cri_events is None:
                # A runtime without the method answers UNIMPLEMENTED within
                # milliseconds; one that has it keeps the stream open and quiet.
                await asyncio.wait([first], timeout=self.probe_s)
                if first.done() and first.exception() is not None:
                    raise first.exception()  # type: ignore[misc]
                self._cri_events = True
            yield Subscribed("cri")
            r = await first
            while r is not grpc.aio.EOF:  # type: ignore[attr-defined]
                event = decode_cri_event(r)
                if event is not None:
                    yield event
                r = await call.read()
            raise RuntimeUnavailable("GetContainerEvents: the stream ended", code="UNAVAILABLE")
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise _stream_error(err, "GetContainerEvents") from err
        finally:
            call.cancel()
            first.cancel()

    async def _subscribe_containerd(self) -> AsyncIterator[RuntimeEvent | Subscribed]:
        request = events_pb2.SubscribeRequest(filters=subscribe_filters(self.namespace))
        call = self._containerd.Subscribe(request)
        try:
            yield Subscribed("containerd")
            async for env in call:
                event = decode_envelope(env, namespace=self.namespace)
                if event is not None:
                    yield event
            raise RuntimeUnavailable("Events/Subscribe: the stream ended", code="UNAVAILABLE")
        except grpc.aio.AioRpcError as err:
            raise_if_cancelled(err)
            raise _stream_error(err, "Events/Subscribe") from err
        finally:
            call.cancel()


def _stream_error(err: grpc.aio.AioRpcError, what: str) -> CRIError:
    code = err.code()
    text = f"{what}: {code.name}: {err.details()}"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return EventsUnsupported(text, code=code.name)
    if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        return RuntimeUnavailable(text, code=code.name)
    return CRIError(text, code=code.name)

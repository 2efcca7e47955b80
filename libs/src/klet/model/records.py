"""Versioned wire records of the Redis bus.

Every value written to a table or stream is a JSON object with `"v": 1`. Decoding is
strict: an unknown version, a missing field or a field of the wrong type raises
`BadRecord`, and the consumer logs it and moves on without acting on it (DESIGN.md:
"never half-processed"). Records are frozen dataclasses so a consumer cannot mutate
what it read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar, get_args

from klet.model.types import JSON, PodUID

VERSION = 1

SourceName = Literal["file", "http", "api"]
ChangeOp = Literal["ADD", "UPDATE", "REMOVE", "DELETE", "RECONCILE"]


class BadRecord(ValueError):
    """A bus payload that cannot be decoded; carries the reason for the log."""


R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    """Base of all bus records: JSON encoding with a version field."""

    kind: ClassVar[str] = "record"

    def encode(self) -> str:
        return json.dumps({"v": VERSION, **asdict(self)}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls: type[R], raw: str | bytes) -> R:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise BadRecord(f"{cls.kind}: not JSON: {err}") from err
        if not isinstance(data, dict):
            raise BadRecord(f"{cls.kind}: expected a JSON object, got {type(data).__name__}")
        version = data.pop("v", None)
        if version != VERSION:
            raise BadRecord(f"{cls.kind}: unsupported version {version!r} (want {VERSION})")
        names = {f.name for f in fields(cls)}
        missing = [f.name for f in fields(cls) if f.name not in data and _required(f)]
        if missing:
            raise BadRecord(f"{cls.kind}: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(data) - names)
        if unknown:
            raise BadRecord(f"{cls.kind}: unknown field(s) {', '.join(unknown)}")
        for f in fields(cls):
            if f.name in data:
                _check_type(cls.kind, f.name, f.type, data[f.name])
        return cls(**data)


def _required(f: Any) -> bool:
    from dataclasses import MISSING

    return bool(f.default is MISSING and f.default_factory is MISSING)


_SIMPLE: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "JSON": dict,
}


def _check_type(kind: str, name: str, annotation: Any, value: Any) -> None:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if text in ("SourceName", "ChangeOp"):
        allowed = get_args(SourceName if text == "SourceName" else ChangeOp)
        if value not in allowed:
            raise BadRecord(f"{kind}: field {name}={value!r} not one of {', '.join(allowed)}")
        return
    if text == "PodUID":
        text = "str"
    expected = _SIMPLE.get(text)
    if expected is not None and (
        not isinstance(value, expected) or (text != "bool" and isinstance(value, bool))
    ):
        raise BadRecord(f"{kind}: field {name} has type {type(value).__name__}, want {text}")


@dataclass(frozen=True)
class DesiredPod(Record):
    """`desired` table value: one pod the node should run, as pod-source merged it."""

    kind: ClassVar[str] = "desired"
    uid: PodUID
    pod: JSON
    source: SourceName
    hash: str
    seen_at: float


@dataclass(frozen=True)
class SourceState(Record):
    """`sources` table value: whether a configured source has delivered a full snapshot.

    Destructive work (killing a pod that is not desired) waits until every configured
    source is ready; a flushed Redis has no entries and so is never ready.
    """

    kind: ClassVar[str] = "source"
    source: SourceName
    ready: bool
    at: float


def sources_ready(states: Mapping[str, SourceState]) -> bool:
    """The gate on destructive work (DESIGN.md), upstream's SeenAllSources: every
    configured pod source has delivered its first full snapshot.

    The `sources` table is the list of configured sources: pod-source, the one service
    that reads the source configuration, writes an entry with ready=False for each
    configured source before its first snapshot and removes the entry of a source no
    longer configured. So "at least one entry, and every entry ready" is exactly that,
    without a second copy of the configuration in the readers; an empty table (a flushed
    Redis, or pod-source not started yet) is never ready.
    """
    return bool(states) and all(s.ready for s in states.values())


@dataclass(frozen=True)
class PodChange(Record):
    """`pods` stream entry: a wake-up telling syncloop that a desired pod changed."""

    kind: ClassVar[str] = "podchange"
    op: ChangeOp
    uid: PodUID
    source: SourceName


@dataclass(frozen=True)
class PodStatusRecord(Record):
    """`status` table value: the latest API PodStatus computed for a pod by syncloop.

    `version` increases monotonically per pod for the lifetime of a syncloop leader; a
    reader drops a record whose version is lower than one it already handled, unless
    `epoch` (the writer's start time) is newer.
    """

    kind: ClassVar[str] = "status"
    uid: PodUID
    namespace: str
    name: str
    version: int
    epoch: float
    status: JSON
    updated_at: float
    # True once a pod that is being deleted (deletionTimestamp, or a kill by request)
    # has no running container and a stopped sandbox: the apiserver object may then be
    # deleted with grace 0, as upstream's status manager does.
    terminated: bool = False


@dataclass(frozen=True)
class PodStatusChange(Record):
    """`podstatus` stream entry: the status of a pod changed to `version`."""

    kind: ClassVar[str] = "podstatuschange"
    uid: PodUID
    version: int


@dataclass(frozen=True)
class EventRecord(Record):
    """`events:<service>` stream entry: a Kubernetes Event to post (status-reporter posts them)."""

    kind: ClassVar[str] = "event"
    type: str  # Normal | Warning
    reason: str
    message: str
    involved: JSON  # {kind, namespace, name, uid, fieldPath?}
    component: str
    at: float
    count: int = 1
    extra: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class NodeConditionRecord(Record):
    """`node:<service>` table value, keyed `<conditionType>` (read together as
    `<service>:<conditionType>`): one service's contribution
    to a Node condition (the eviction service's MemoryPressure, syncloop's Ready, ...).

    A level, not an event: the writer keeps it current (status "True", "False" or
    "Unknown") and status-reporter folds every contribution into the Node's conditions
    on each status update. Empty `reason`/`message` leave upstream's defaults in place.
    `at` is when the writer last decided the value (Unix seconds).
    """

    kind: ClassVar[str] = "nodecondition"
    type: str
    status: str
    at: float
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class ImageUseRecord(Record):
    """`images` table value, keyed by image ID: what image GC knows of one image's use.

    Written by image-gc after each detection so that a restarted (or new leader)
    image-gc keeps the least-recently-used order instead of treating every image as
    just detected. Times are Unix seconds; `last_used` 0 means never seen in use.
    """

    kind: ClassVar[str] = "imageuse"
    id: str
    first_detected: float
    last_used: float


@dataclass(frozen=True)
class VolumeRecord(Record):
    """`volumes` table value, keyed `<pod uid>/<volume name>`: a CSI volume published
    for a pod on this node, or a volume the node measures itself (memory-backed
    emptyDir, configMap, secret, projected, downwardAPI: no unique name). syncloop writes
    it from what is on disk; status-reporter reports `volumesInUse` in the Node status
    and the usage in /stats/summary and the `kubelet_volume_stats_*` metrics."""

    kind: ClassVar[str] = "volume"
    pod_uid: str
    namespace: str
    pod: str
    volume: str  # the pod spec's volume name
    claim: str  # the PersistentVolumeClaim's name; "" for an inline volume
    unique_name: str  # kubernetes.io/csi/<driver>^<volume handle>, as upstream names it; "": none
    usage: JSON  # capacityBytes, availableBytes, usedBytes, inodes, inodesFree, inodesUsed
    measured_at: float  # when `usage` was measured; 0: never (the driver gives none)


@dataclass(frozen=True)
class CSIDriverRecord(Record):
    """`csidrivers` table value, keyed by driver name: a CSI driver registered on this
    node through its registration socket (syncloop's plugin watcher writes it; the
    volume code calls the driver at `endpoint`, status-reporter publishes `node_id`,
    `max_volumes` and `topology` in the node's CSINode object and on the Node)."""

    kind: ClassVar[str] = "csidriver"
    name: str
    endpoint: str  # the driver's CSI socket
    registration: str  # the registration socket it came from
    node_id: str
    max_volumes: int  # 0: no limit
    topology: JSON  # segment key -> value
    versions: str  # the CSI versions it supports, comma-separated
    registered_at: float


@dataclass(frozen=True)
class DeviceResourceRecord(Record):
    """`devices` table value, keyed by extended resource name: the devices a device
    plugin (deviceplugin v1beta1) lists on this node. syncloop's device manager writes
    it from the plugin's ListAndWatch; status-reporter puts `healthy + unhealthy` in the
    Node's capacity and `healthy` in its allocatable. A plugin that went away leaves
    its devices unhealthy (`connected` False) until upstream's grace period ends, then
    the record stays with both counts 0 so the Node reports the resource at 0, as
    upstream's kubelet does for a removed resource."""

    kind: ClassVar[str] = "deviceresource"
    resource: str
    healthy: int
    unhealthy: int
    connected: bool  # the plugin's ListAndWatch stream is open
    at: float  # when the counts last changed (Unix seconds)


@dataclass(frozen=True)
class HistoryEntry(Record):
    """`history:<pod uid>` stream entry: one thing decided about or seen of a pod, kept
    for `klet why` (status-reporter's leader writes it, klet.model.podhistory says
    what each kind holds). `at` is when it happened (Unix seconds): the Event's time, or
    the container's own start or finish time for what its status shows."""

    kind: ClassVar[str] = "history"
    at: float
    source: str  # the service that decided it (the Event's), or "status" for status changes
    what: str  # event | started | exited | waiting | ready | phase
    type: str  # Normal | Warning
    reason: str
    message: str
    container: str = ""
    detail: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class HistoryIndexRecord(Record):
    """`history` table value, keyed by pod UID: which pod a history is of, and what of
    its status was last recorded (`containers`: name -> the facts the next status is
    compared with), so a restarted or new leader records only what changed since."""

    kind: ClassVar[str] = "historyindex"
    namespace: str
    name: str
    first_at: float
    last_at: float
    phase: str = ""
    containers: JSON = field(default_factory=dict)

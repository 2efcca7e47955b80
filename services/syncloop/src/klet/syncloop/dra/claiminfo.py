"""What klet keeps of each prepared ResourceClaim, and its checkpoint in upstream's format.

As upstream's claiminfo.go: per claim, its UID, name and namespace, the pods using it,
and per driver the devices the driver's NodePrepareResources answered (pool, device,
the requests it satisfies, its CDI device IDs). A container's CDI devices for a claim
request are those of the devices satisfying that request, or every device when the
request names none (`cdi_devices`). A claim is keyed by `<namespace>/<name>`, as
upstream's cache.

The checkpoint is upstream's `dra_manager_state` in the root dir, so a node moved from
the upstream kubelet to klet (or back) keeps its prepared claims: a JSON object
`{"Data": <string>, "Checksum": <CRC-32 IEEE of that string's UTF-8 bytes>}` whose Data
is the JSON of `{"kind": "DRACheckpoint", "apiVersion":
"checkpoint.dra.kubelet.k8s.io/v1", "ClaimInfoStateList": [...]}`, each entry with Go's
field names; a pod UID set is an object of empty objects, map keys sorted, an empty list
`null`, as Go's encoding/json writes them (and with its escaping of `<`, `>`, `&`, so the
checksum of a string holding one is the same). Decoding checks the checksum (upstream's
CorruptCheckpointError) and every field's type, naming the field; like upstream it does
not check the kind and apiVersion (upstream's test of an upgrade reads a
`checkpoint.dra.kubelet.k8s.io/v0` Data as v1), and a field it does not know is ignored
and one missing is empty, as Go's decoder does. Pure: no I/O (`state.py` reads and
writes the file).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from klet.model.dra import PreparedDevice

CHECKPOINT_NAME = "dra_manager_state"
"""The checkpoint's file name in the root dir (upstream's draManagerStateFileName)."""
CHECKPOINT_KIND = "DRACheckpoint"
CHECKPOINT_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


class CorruptCheckpoint(ValueError):
    """The checkpoint cannot be read as upstream's; the message says where and why."""


@dataclass(frozen=True)
class ClaimInfo:
    """One prepared (or being prepared) claim, as upstream's ClaimInfoState."""

    claim_uid: str
    claim_name: str
    namespace: str
    pod_uids: frozenset[str] = frozenset()
    driver_state: Mapping[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    """Driver name → the devices it prepared for the claim."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.claim_name}"

    def with_devices(self, driver: str, devices: Iterable[PreparedDevice]) -> ClaimInfo:
        state = dict(self.driver_state)
        state[driver] = (*state.get(driver, ()), *devices)
        return replace(self, driver_state=state)

    def with_pod(self, pod_uid: str) -> ClaimInfo:
        return replace(self, pod_uids=self.pod_uids | {pod_uid})

    def without_pod(self, pod_uid: str) -> ClaimInfo:
        return replace(self, pod_uids=self.pod_uids - {pod_uid})

    def cdi_devices(self, request_name: str = "") -> list[str]:
        """The CDI device IDs a container using `request_name` of this claim gets (all
        of the claim's for ""), as upstream's cdiDevicesAsList."""
        return [
            cdi
            for driver in sorted(self.driver_state)
            for device in self.driver_state[driver]
            if not request_name or not device.request_names or request_name in device.request_names
            for cdi in device.cdi_device_ids
        ]


def _strings_or_null(values: tuple[str, ...]) -> list[str] | None:
    return list(values) if values else None


def _entry(info: ClaimInfo) -> dict[str, object]:
    # Objects in Go's order: a struct's fields as declared, a map's keys sorted.
    return {
        "ClaimUID": info.claim_uid,
        "ClaimName": info.claim_name,
        "Namespace": info.namespace,
        "PodUIDs": {uid: {} for uid in sorted(info.pod_uids)},
        "DriverState": {
            driver: {
                "Devices": [
                    {
                        "PoolName": d.pool_name,
                        "DeviceName": d.device_name,
                        "RequestNames": _strings_or_null(d.request_names),
                        "CDIDeviceIDs": _strings_or_null(d.cdi_device_ids),
                    }
                    for d in info.driver_state[driver]
                ]
                or None
            }
            for driver in sorted(info.driver_state)
        },
    }


def _compact(value: object) -> str:
    """Go's encoding of a value whose objects are already in Go's order."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return _go_json_escapes(text)


def _go_json_escapes(text: str) -> str:
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text


def checksum(data: str) -> int:
    """upstream's checksum of the Data string: CRC-32 (IEEE) of its bytes."""
    return zlib.crc32(data.encode())


def encode(claims: Iterable[ClaimInfo]) -> bytes:
    """The checkpoint file's bytes for `claims` (in their order, as upstream's list)."""
    entries = [_entry(c) for c in claims]
    data = _compact(
        {
            "kind": CHECKPOINT_KIND,
            "apiVersion": CHECKPOINT_API_VERSION,
            "ClaimInfoStateList": entries or None,
        }
    )
    return _compact({"Data": data, "Checksum": checksum(data)}).encode()


def _string(obj: Mapping[str, Any], name: str, where: str) -> str:
    value = obj.get(name, "")
    if not isinstance(value, str):
        raise CorruptCheckpoint(f"{where}.{name} is {type(value).__name__}, not a string")
    return value


def _field(obj: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise CorruptCheckpoint(f"{where}.{name} is {type(value).__name__}, not {kind.__name__}")
    return value


def _optional_strings(obj: Mapping[str, Any], name: str, where: str) -> tuple[str, ...]:
    value = obj.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorruptCheckpoint(f"{where}.{name} is not a list of strings")
    return tuple(value)


def _or_empty(value: object, empty: object) -> Any:
    """`empty` for a JSON null (Go's nil map or slice), else `value` as it is."""
    return empty if value is None else value


def _decode_entry(raw: object, where: str) -> ClaimInfo:
    if not isinstance(raw, dict):
        raise CorruptCheckpoint(f"{where} is {type(raw).__name__}, not an object")
    pods = _or_empty(raw.get("PodUIDs"), {})
    if not isinstance(pods, dict):
        raise CorruptCheckpoint(f"{where}.PodUIDs is {type(pods).__name__}, not an object")
    drivers = _or_empty(raw.get("DriverState"), {})
    if not isinstance(drivers, dict):
        raise CorruptCheckpoint(f"{where}.DriverState is {type(drivers).__name__}, not an object")
    state: dict[str, tuple[PreparedDevice, ...]] = {}
    for driver, ds in drivers.items():
        at = f"{where}.DriverState[{driver!r}]"
        if not isinstance(ds, dict):
            raise CorruptCheckpoint(f"{at} is {type(ds).__name__}, not an object")
        devices = _or_empty(ds.get("Devices"), [])
        if not isinstance(devices, list):
            raise CorruptCheckpoint(f"{at}.Devices is {type(devices).__name__}, not a list")
        found = []
        for i, d in enumerate(devices):
            dat = f"{at}.Devices[{i}]"
            if not isinstance(d, dict):
                raise CorruptCheckpoint(f"{dat} is {type(d).__name__}, not an object")
            found.append(
                PreparedDevice(
                    pool_name=_string(d, "PoolName", dat),
                    device_name=_string(d, "DeviceName", dat),
                    request_names=_optional_strings(d, "RequestNames", dat),
                    cdi_device_ids=_optional_strings(d, "CDIDeviceIDs", dat),
                )
            )
        state[driver] = tuple(found)
    return ClaimInfo(
        claim_uid=_string(raw, "ClaimUID", where),
        claim_name=_string(raw, "ClaimName", where),
        namespace=_string(raw, "Namespace", where),
        pod_uids=frozenset(pods),
        driver_state=state,
    )


def decode(blob: bytes) -> list[ClaimInfo]:
    """The claims of a checkpoint file's bytes; CorruptCheckpoint naming the cause."""
    try:
        outer = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptCheckpoint(f"not JSON: {err}") from err
    if not isinstance(outer, dict):
        raise CorruptCheckpoint(f"the checkpoint is {type(outer).__name__}, not an object")
    data = _field(outer, "Data", str, "checkpoint")
    stored = outer.get("Checksum")
    if not isinstance(stored, int) or isinstance(stored, bool):
        raise CorruptCheckpoint("checkpoint.Checksum is not an integer")
    expected = checksum(data)
    if stored != expected:
        raise CorruptCheckpoint(
            f"checkpoint is corrupted: checksum {stored} does not match {expected} of its Data"
        )
    try:
        inner = json.loads(data)
    except ValueError as err:
        raise CorruptCheckpoint(f"checkpoint.Data is not JSON: {err}") from err
    if not isinstance(inner, dict):
        raise CorruptCheckpoint(f"checkpoint.Data is {type(inner).__name__}, not an object")
    entries = _or_empty(inner.get("ClaimInfoStateList"), [])
    if not isinstance(entries, list):
        raise CorruptCheckpoint("checkpoint.Data.ClaimInfoStateList is not a list")
    return [_decode_entry(e, f"ClaimInfoStateList[{i}]") for i, e in enumerate(entries)]

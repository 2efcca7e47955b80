"""The device manager's checkpoint, `<root-dir>/device-plugins/kubelet_internal_checkpoint`.

Upstream's format, so a node moved between klet and the upstream kubelet keeps its
device allocations: JSON `{"Data": {"PodDeviceEntries": [...], "RegisteredDevices":
{...}}, "Checksum": N}`, where each entry holds the pod UID, container, resource, the
device IDs per NUMA node (`"-1"` for none) and the plugin's serialized
`ContainerAllocateResponse` (base64, as Go encodes a byte slice).

The checksum is the hard part: upstream hashes (FNV-1a, 32 bits) the text go-spew
prints for the Go value with `%#v` (sorted keys, no methods), not the JSON. That text
is rebuilt here for the one Go type the checkpoint has, so a file the upstream
kubelet wrote verifies and one written here verifies there. Go's nil and empty differ
in that text (`<nil>` against `[]`/`map[]`), which is why the model keeps `None`
apart from empty: a file with `null` in it must hash as Go would read it.

Pure: bytes in, values out; the manager reads and writes the file.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

CHECKPOINT_NAME = "kubelet_internal_checkpoint"

NO_NUMA = -1
"""The NUMA node key of devices without topology (upstream's nodeWithoutTopology)."""


class CorruptCheckpoint(ValueError):
    """The file does not decode, or its checksum does not match its data."""


@dataclass(frozen=True)
class PodDevicesEntry:
    """The devices of one resource given to one container, and the plugin's answer."""

    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: Mapping[int, Sequence[str] | None] | None = field(default_factory=dict)
    """NUMA node → device IDs, in the order the plugin was given them."""
    alloc_resp: bytes | None = None
    """The serialized ContainerAllocateResponse; None as Go's nil slice."""

    def devices(self) -> set[str]:
        return {d for ids in (self.device_ids or {}).values() for d in ids or ()}


@dataclass(frozen=True)
class DeviceCheckpoint:
    entries: Sequence[PodDevicesEntry] | None = ()
    registered: Mapping[str, Sequence[str] | None] | None = field(default_factory=dict)
    """Resource → its healthy device IDs when written (upstream's RegisteredDevices)."""


# -- go-spew's %#v text of checkpointData, and its FNV-1a hash --------------------------


def _strings(values: Sequence[str] | None) -> str:
    return "<nil>" if values is None else "[" + " ".join(values) + "]"


def _numa(ids: Mapping[int, Sequence[str] | None] | None) -> str:
    if ids is None:
        return "<nil>"
    return "map[" + " ".join(f"{k}:{_strings(ids[k])}" for k in sorted(ids)) + "]"


def _bytes(data: bytes | None) -> str:
    return "<nil>" if data is None else "[" + " ".join(str(b) for b in data) + "]"


def _entry(e: PodDevicesEntry) -> str:
    return (
        f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container_name} "
        f"ResourceName:(string){e.resource_name} "
        f"DeviceIDs:(checkpoint.DevicesPerNUMA){_numa(e.device_ids)} "
        f"AllocResp:([]uint8){_bytes(e.alloc_resp)}}}"
    )


def spew_text(cp: DeviceCheckpoint) -> str:
    """What upstream's dump.ForHash prints for the checkpoint's data."""
    entries = "<nil>" if cp.entries is None else "[" + " ".join(map(_entry, cp.entries)) + "]"
    if cp.registered is None:
        registered = "<nil>"
    else:
        registered = (
            "map["
            + " ".join(f"{k}:{_strings(cp.registered[k])}" for k in sorted(cp.registered))
            + "]"
        )
    return (
        f"(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry){entries} "
        f"RegisteredDevices:(map[string][]string){registered}}}"
    )


def fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def checksum(cp: DeviceCheckpoint) -> int:
    return fnv32a(spew_text(cp).encode())


# -- JSON ------------------------------------------------------------------------------


def _entry_json(e: PodDevicesEntry) -> dict[str, object]:
    return {
        "PodUID": e.pod_uid,
        "ContainerName": e.container_name,
        "ResourceName": e.resource_name,
        "DeviceIDs": None
        if e.device_ids is None
        else {str(k): None if v is None else list(v) for k, v in sorted(e.device_ids.items())},
        "AllocResp": None if e.alloc_resp is None else base64.b64encode(e.alloc_resp).decode(),
    }


def encode(cp: DeviceCheckpoint) -> bytes:
    data = {
        "PodDeviceEntries": None if cp.entries is None else [_entry_json(e) for e in cp.entries],
        "RegisteredDevices": None
        if cp.registered is None
        else {k: None if v is None else list(v) for k, v in sorted(cp.registered.items())},
    }
    return json.dumps(
        {"Data": data, "Checksum": checksum(cp)}, separators=(",", ":"), ensure_ascii=False
    ).encode()


def _str_list(value: object, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorruptCheckpoint(f"{where}: not a list of strings")
    return list(value)


def _decode_entry(raw: object, i: int) -> PodDevicesEntry:
    where = f"Data.PodDeviceEntries[{i}]"
    if not isinstance(raw, dict):
        raise CorruptCheckpoint(f"{where}: not an object")
    strings = {}
    for key in ("PodUID", "ContainerName", "ResourceName"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            raise CorruptCheckpoint(f"{where}.{key}: not a string")
        strings[key] = value
    ids_raw = raw.get("DeviceIDs")
    ids: dict[int, Sequence[str] | None] | None = None
    if ids_raw is not None:
        if not isinstance(ids_raw, dict):
            raise CorruptCheckpoint(f"{where}.DeviceIDs: not an object")
        ids = {}
        for k, v in ids_raw.items():
            try:
                node = int(k)
            except ValueError:
                raise CorruptCheckpoint(
                    f"{where}.DeviceIDs: NUMA node {k!r} is not an integer"
                ) from None
            ids[node] = _str_list(v, f"{where}.DeviceIDs[{k}]")
    resp_raw = raw.get("AllocResp")
    resp: bytes | None = None
    if resp_raw is not None:
        if not isinstance(resp_raw, str):
            raise CorruptCheckpoint(f"{where}.AllocResp: not a base64 string")
        try:
            resp = base64.b64decode(resp_raw, validate=True)
        except binascii.Error as err:
            raise CorruptCheckpoint(f"{where}.AllocResp: {err}") from err
    return PodDevicesEntry(
        pod_uid=strings["PodUID"],
        container_name=strings["ContainerName"],
        resource_name=strings["ResourceName"],
        device_ids=ids,
        alloc_resp=resp,
    )


def decode(blob: bytes) -> DeviceCheckpoint:
    """The checkpoint in `blob`; raises CorruptCheckpoint naming what is wrong, a
    checksum that does not match included (upstream's CorruptCheckpointError)."""
    try:
        doc = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptCheckpoint(f"not JSON: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("Data"), dict):
        raise CorruptCheckpoint("no Data object")
    data = doc["Data"]
    raw_entries = data.get("PodDeviceEntries")
    entries: list[PodDevicesEntry] | None = None
    if raw_entries is not None:
        if not isinstance(raw_entries, list):
            raise CorruptCheckpoint("Data.PodDeviceEntries: not a list")
        entries = [_decode_entry(e, i) for i, e in enumerate(raw_entries)]
    raw_reg = data.get("RegisteredDevices")
    registered: dict[str, Sequence[str] | None] | None = None
    if raw_reg is not None:
        if not isinstance(raw_reg, dict):
            raise CorruptCheckpoint("Data.RegisteredDevices: not an object")
        registered = {k: _str_list(v, f"Data.RegisteredDevices[{k}]") for k, v in raw_reg.items()}
    cp = DeviceCheckpoint(entries=entries, registered=registered)
    expected = doc.get("Checksum")
    actual = checksum(cp)
    if expected != actual:
        raise CorruptCheckpoint(
            f"checkpoint is corrupted: checksum {expected!r} in the file, {actual} of its data"
        )
    return cp

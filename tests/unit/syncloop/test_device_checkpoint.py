"""The device manager checkpoint in upstream's format: encode/decode round trips, and
the checksum equals the one upstream's kubelet computes (go-spew %#v text, FNV-1a).

The two vectors below were produced by upstream's own code path: go-spew
v1.1.2-0.20180830191138-d8f796af33cc with dump.ForHash's configuration over the same
Go types as k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint, hashed with
hash/fnv New32a and marshalled with encoding/json, so a file written by either side
verifies on the other.
"""

from __future__ import annotations

import json

import pytest
from klet.syncloop.devices.checkpoint import (
    CorruptCheckpoint,
    DeviceCheckpoint,
    PodDevicesEntry,
    checksum,
    decode,
    encode,
    spew_text,
)

EMPTY_GO = b'{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":2932075448}'

FULL_GO = (
    b'{"Data":{"PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"c1",'
    b'"ResourceName":"example.com/foo","DeviceIDs":{"-1":["dev-b","dev-a"],"0":["dev-c"]},'
    b'"AllocResp":"CgNhYmMA/w=="},{"PodUID":"uid-2","ContainerName":"c\\"2",'
    b'"ResourceName":"example.com/bar","DeviceIDs":{},"AllocResp":null}],'
    b'"RegisteredDevices":{"example.com/bar":[],"example.com/foo":["dev-a","dev-b","dev-c"],'
    b'"z/none":null}},"Checksum":2512196036}'
)

FULL_SPEW = (
    "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
    "[{PodUID:(string)uid-1 ContainerName:(string)c1 ResourceName:(string)example.com/foo "
    "DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[dev-b dev-a] 0:[dev-c]] "
    "AllocResp:([]uint8)[10 3 97 98 99 0 255]} {PodUID:(string)uid-2 "
    'ContainerName:(string)c"2 ResourceName:(string)example.com/bar '
    "DeviceIDs:(checkpoint.DevicesPerNUMA)map[] AllocResp:([]uint8)<nil>}] "
    "RegisteredDevices:(map[string][]string)map[example.com/bar:[] "
    "example.com/foo:[dev-a dev-b dev-c] z/none:<nil>]}"
)

FULL = DeviceCheckpoint(
    entries=(
        PodDevicesEntry(
            pod_uid="uid-1",
            container_name="c1",
            resource_name="example.com/foo",
            device_ids={-1: ("dev-b", "dev-a"), 0: ("dev-c",)},
            alloc_resp=bytes([10, 3, 97, 98, 99, 0, 255]),
        ),
        PodDevicesEntry(
            pod_uid="uid-2", container_name='c"2', resource_name="example.com/bar", device_ids={}
        ),
    ),
    registered={
        "example.com/foo": ("dev-a", "dev-b", "dev-c"),
        "example.com/bar": (),
        "z/none": None,
    },
)


def test_upstreams_files_verify_and_decode() -> None:
    assert decode(EMPTY_GO) == DeviceCheckpoint(entries=[], registered={})
    cp = decode(FULL_GO)
    assert spew_text(cp) == FULL_SPEW
    assert checksum(cp) == 2512196036
    first, second = cp.entries or []
    assert first.device_ids == {-1: ["dev-b", "dev-a"], 0: ["dev-c"]}
    assert first.alloc_resp == bytes([10, 3, 97, 98, 99, 0, 255])
    assert first.devices() == {"dev-a", "dev-b", "dev-c"}
    assert second.container_name == 'c"2' and second.alloc_resp is None
    assert cp.registered is not None and cp.registered["z/none"] is None


def test_written_here_hashes_as_upstream_and_round_trips() -> None:
    blob = encode(FULL)
    assert json.loads(blob)["Checksum"] == 2512196036
    assert json.loads(blob) == json.loads(FULL_GO)
    again = decode(blob)
    assert encode(again) == blob
    assert json.loads(encode(DeviceCheckpoint()))["Checksum"] == 2932075448


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (FULL_GO.replace(b"2512196036", b"2512196037"), "checksum 2512196037"),
        (FULL_GO.replace(b'"dev-c"]}', b'"dev-x"]}'), "checksum"),
        (b"{not json", "not JSON"),
        (b'{"Checksum":1}', "no Data"),
        (FULL_GO.replace(b'"-1":', b'"x":'), "NUMA node 'x'"),
        (FULL_GO.replace(b'"CgNhYmMA/w=="', b'"@@"'), "AllocResp"),
        (
            FULL_GO.replace(b'"PodUID":"uid-1"', b'"PodUID":1'),
            r"PodDeviceEntries\[0\]\.PodUID: not a string",
        ),
    ],
)
def test_a_damaged_file_is_refused_naming_why(blob: bytes, says: str) -> None:
    with pytest.raises(CorruptCheckpoint, match=says):
        decode(blob)

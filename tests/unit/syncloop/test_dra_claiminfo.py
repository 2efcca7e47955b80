"""The DRA claim info and its checkpoint (klet.syncloop.dra.claiminfo, .state).

The checkpoint is upstream's `dra_manager_state`, byte for byte: the claims of
upstream's checkpointer tests (state/checkpointer_test.go: one claim with one device,
one claim with two devices, two claims of which one has a device with null requests and
CDI IDs) encode to exactly the file upstream writes, Checksum included, and decode back;
an empty cache is upstream's new checkpoint (`ClaimInfoStateList: null`). Upstream's
failing vectors fail here too: a wrong checksum ("checkpoint is corrupted"), truncated
JSON; its upgrade vectors load (no RequestNames, apiVersion v0). A field of the wrong
type is named by its place. Go's escaping of `<`, `>` and `&` keeps the checksum
upstream's. The pure model: pods added and removed, devices added per driver, and a
request's CDI devices as upstream's cdiDevicesAsList (those of the devices satisfying
the request, or naming no request; all for no request). The file: created empty on the
first load, written whole, and a corrupt one an error naming the file."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from klet.model.dra import PreparedDevice
from klet.syncloop.dra.claiminfo import ClaimInfo, CorruptCheckpoint, decode, encode
from klet.syncloop.dra.state import ClaimCheckpoint, DRACheckpointError

DRIVER = "test-driver.cdi.k8s.io"
POD = "139cdb46-f989-4f17-9561-ca10cfb509a6"
CDI = ("example.com/example=cdi-example",)
DEV1 = PreparedDevice("worker-1", "dev-1", ("test request",), CDI)
DEV2 = PreparedDevice("worker-1", "dev-2", ("test request",), CDI)


def claim(name: str, uid: str, *devices: PreparedDevice) -> ClaimInfo:
    return ClaimInfo(uid, name, "default", frozenset({POD}), {DRIVER: devices})


ONE = claim("example", "067798be-454e-4be4-9047-1aa06aea63f7", DEV1)
# upstream's test vectors (state/checkpointer_test.go, v1.34.4), whole files
SINGLE = (
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",'
    r"\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\","
    r"\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":"
    r"{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":"
    r"{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"RequestNames\":"
    r'[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}",'
    r'"Checksum":1656016162}'
)
TWO_DEVICES = (
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",'
    r"\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\","
    r"\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":"
    r"{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":"
    r"{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"RequestNames\":"
    r"[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]},"
    r"{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-2\",\"RequestNames\":[\"test request\"],"
    r'\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":3369508096}'
)
TWO_CLAIMS = (
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",'
    r"\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\","
    r"\"ClaimName\":\"example-1\",\"Namespace\":\"default\",\"PodUIDs\":"
    r"{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":"
    r"{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"RequestNames\":"
    r"[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}},"
    r"{\"ClaimUID\":\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\",\"ClaimName\":\"example-2\","
    r"\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},"
    r"\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\","
    r'\"DeviceName\":\"dev-2\",\"RequestNames\":null,\"CDIDeviceIDs\":null}]}}}]}",'
    r'"Checksum":1582256999}'
)
UPGRADED_V0 = (
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v0\",'
    r"\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\","
    r"\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":"
    r"{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":"
    r"{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"CDIDeviceIDs\":"
    r'[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":1284376732}'
)
WRONG_CHECKSUM = SINGLE.replace("1656016162", "1656016163")
CASES = [
    ([ONE], SINGLE),
    ([claim("example", "067798be-454e-4be4-9047-1aa06aea63f7", DEV1, DEV2)], TWO_DEVICES),
    (
        [
            claim("example-1", "067798be-454e-4be4-9047-1aa06aea63f7", DEV1),
            claim(
                "example-2",
                "4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
                PreparedDevice("worker-1", "dev-2"),
            ),
        ],
        TWO_CLAIMS,
    ),
]


@pytest.mark.parametrize(("claims", "upstream"), CASES)
def test_encoding_is_upstreams_file_byte_for_byte(claims: list[ClaimInfo], upstream: str) -> None:
    assert encode(claims).decode() == upstream
    assert decode(upstream.encode()) == claims


def test_an_empty_cache_is_upstreams_new_checkpoint() -> None:
    data = (
        '{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1",'
        '"ClaimInfoStateList":null}'
    )
    assert json.loads(encode([])) == {"Data": data, "Checksum": zlib.crc32(data.encode())}
    assert decode(encode([])) == []


def test_an_upgraded_checkpoint_loads() -> None:
    [got] = decode(UPGRADED_V0.encode())
    assert got == claim("example", ONE.claim_uid, PreparedDevice("worker-1", "dev-1", (), CDI))


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (WRONG_CHECKSUM, "checkpoint is corrupted: checksum 1656016163 does not match 1656016162"),
        ("{", "not JSON"),
        ("[]", "the checkpoint is list, not an object"),
        ('{"Data":1,"Checksum":1}', "checkpoint.Data is int, not str"),
        ('{"Data":"{}","Checksum":"x"}', "checkpoint.Checksum is not an integer"),
    ],
)
def test_upstreams_failures_fail(blob: str, why: str) -> None:
    with pytest.raises(CorruptCheckpoint, match=why):
        decode(blob.encode())


def _file(data: dict[str, object]) -> bytes:
    text = json.dumps(data)
    return json.dumps({"Data": text, "Checksum": zlib.crc32(text.encode())}).encode()


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"ClaimUID": 7}, r"ClaimInfoStateList\[0\].ClaimUID is int, not a string"),
        ({"PodUIDs": []}, r"ClaimInfoStateList\[0\].PodUIDs is list, not an object"),
        (
            {"DriverState": {"d": {"Devices": [{"PoolName": None, "DeviceName": "x"}]}}},
            r"ClaimInfoStateList\[0\].DriverState\['d'\].Devices\[0\].PoolName is NoneType",
        ),
        (
            {"DriverState": {"d": {"Devices": [{"CDIDeviceIDs": "x"}]}}},
            r"Devices\[0\].CDIDeviceIDs is not a list of strings",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_named(entry: dict[str, object], where: str) -> None:
    with pytest.raises(CorruptCheckpoint, match=where):
        decode(_file({"ClaimInfoStateList": [entry]}))


def test_go_escaping_keeps_the_checksum_upstreams() -> None:
    odd = ClaimInfo("u", "a<b>&c", "ns")
    data = json.loads(encode([odd]))["Data"]
    assert r"a\u003cb\u003e\u0026c" in data
    assert decode(encode([odd])) == [odd]


def test_pods_and_devices() -> None:
    info = ClaimInfo("uid", "c", "ns")
    assert info.key == "ns/c"
    info = info.with_pod("p1").with_pod("p2").without_pod("p1")
    assert info.pod_uids == {"p2"}
    info = info.with_devices(DRIVER, [DEV1]).with_devices(DRIVER, [DEV2])
    assert info.driver_state == {DRIVER: (DEV1, DEV2)}


def test_cdi_devices_per_request_as_upstream() -> None:
    info = ClaimInfo(
        "uid",
        "c",
        "ns",
        driver_state={
            "b.example.com": (PreparedDevice("p", "gpu", ("gpu",), ("b.com/gpu=0",)),),
            "a.example.com": (
                PreparedDevice("p", "nic", ("nic",), ("a.com/nic=0", "a.com/nic=1")),
                PreparedDevice("p", "any", (), ("a.com/any=0",)),
            ),
        },
    )
    assert info.cdi_devices("gpu") == ["a.com/any=0", "b.com/gpu=0"]
    assert info.cdi_devices("nic") == ["a.com/nic=0", "a.com/nic=1", "a.com/any=0"]
    assert info.cdi_devices() == ["a.com/nic=0", "a.com/nic=1", "a.com/any=0", "b.com/gpu=0"]


def test_the_file_is_created_written_whole_and_a_corrupt_one_named(tmp_path: Path) -> None:
    checkpoint = ClaimCheckpoint(tmp_path)
    assert checkpoint.load() == []
    assert (tmp_path / "dra_manager_state").read_bytes() == encode([])
    checkpoint.store([ONE])
    assert (tmp_path / "dra_manager_state").read_text() == SINGLE
    assert ClaimCheckpoint(tmp_path).load() == [ONE]
    assert [p.name for p in tmp_path.iterdir()] == ["dra_manager_state"]
    (tmp_path / "dra_manager_state").write_text(WRONG_CHECKSUM)
    with pytest.raises(
        DRACheckpointError, match=f"{tmp_path}/dra_manager_state: checkpoint is corrupted"
    ):
        checkpoint.load()

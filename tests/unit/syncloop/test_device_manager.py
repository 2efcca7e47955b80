"""The device manager (klet.syncloop.devices.manager) over a fake plugin and table, and
the registration rules (devices/plugins.py): a plugin's list becomes the bus counts;
a gone plugin leaves its devices unhealthy, then after upstream's 5-minute grace none;
container creation allocates (preferred allocation asked, PreStartContainer called)
and merges the answer; the checkpoint written on disk brings the allocation back in a
new manager (a restarted syncloop), so the container gets the same answer without a
new Allocate and admission keeps its pod; finished pods' devices are released."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from klet.model.devices import Device, PluginOptions, Registration
from klet.model.records import DeviceResourceRecord
from klet.syncloop.devices import checkpoint
from klet.syncloop.devices.allocation import AllocationError, DeviceMount, DeviceRunOptions
from klet.syncloop.devices.manager import STOP_GRACE_S, DeviceManager
from klet.syncloop.devices.plugins import validate

FOO = "example.com/foo"


class FakePlugin:
    def __init__(self, *, fail: str = "") -> None:
        self.allocated: list[list[str]] = []
        self.pre_started: list[list[str]] = []
        self.asked: list[tuple[list[str], list[str], int]] = []
        self.fail = fail

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        self.asked.append((list(available), list(must_include), size))
        return sorted(available, reverse=True)[:size]

    async def allocate(self, device_ids: Sequence[str]) -> bytes:
        if self.fail:
            raise RuntimeError(self.fail)
        self.allocated.append(list(device_ids))
        return ",".join(device_ids).encode()

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        self.pre_started.append(list(device_ids))


class FakeTable:
    def __init__(self) -> None:
        self.rows: dict[str, DeviceResourceRecord] = {}
        self.puts = 0

    async def put(self, key: str, value: DeviceResourceRecord) -> None:
        self.rows[key] = value
        self.puts += 1


def decode(blob: bytes) -> DeviceRunOptions:
    ids = blob.decode().split(",")
    return DeviceRunOptions(
        envs=(("FOO", blob.decode()),),
        mounts=tuple(DeviceMount(f"/foo/{d}", f"/host/{d}") for d in ids),
        cdi_devices=tuple(f"example.com/foo={d}" for d in ids),
    )


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def manager(tmp_path: Path, clock: Clock | None = None) -> tuple[DeviceManager, FakeTable]:
    table = FakeTable()
    tmp_path.mkdir(exist_ok=True)
    return DeviceManager(tmp_path, table=table, decode=decode, clock=clock or Clock()), table


def devices(*health: str) -> list[Device]:
    return [Device(f"d{i}", h) for i, h in enumerate(health)]


def pod(uid: str, n: int, *, init: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {FOO: str(n)}}}],
    }
    if init:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": {FOO: str(init)}}}]
    return {"metadata": {"uid": uid}, "spec": spec}


async def test_counts_follow_the_plugin_then_the_grace_period(tmp_path: Path) -> None:
    clock = Clock()
    m, table = manager(tmp_path, clock)
    plugin = FakePlugin()
    m.connected(FOO, plugin, PluginOptions())
    m.listed(FOO, plugin, devices("Healthy", "Healthy", "Unhealthy"))
    await m.publish()
    assert (table.rows[FOO].healthy, table.rows[FOO].unhealthy, table.rows[FOO].connected) == (
        2,
        1,
        True,
    )
    await m.publish()
    assert table.puts == 1  # unchanged counts are not written again
    m.listed(FOO, FakePlugin(), devices("Healthy"))  # a stale plugin's list is ignored
    m.disconnected(FOO, plugin)
    await m.publish()
    assert (table.rows[FOO].healthy, table.rows[FOO].unhealthy, table.rows[FOO].connected) == (
        0,
        3,
        False,
    )
    clock.now += STOP_GRACE_S - 1
    assert m.expire() == []
    clock.now += 1
    assert m.expire() == [FOO]
    await m.publish()
    assert (table.rows[FOO].healthy, table.rows[FOO].unhealthy) == (0, 0)


async def test_allocation_checkpoint_and_restart(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    plugin = FakePlugin()
    m.connected(
        FOO, plugin, PluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
    )
    m.listed(FOO, plugin, devices("Healthy", "Healthy", "Healthy"))
    p = pod("u1", 1)
    assert m.admit("u1", p, []) is None
    options = await m.container_options(p, p["spec"]["containers"][0])
    assert plugin.asked == [(["d0", "d1", "d2"], [], 1)]
    assert plugin.allocated == [["d2"]]  # the plugin's preference
    assert plugin.pre_started == [["d2"]]
    assert options == DeviceRunOptions(
        envs=(("FOO", "d2"),),
        mounts=(DeviceMount("/foo/d2", "/host/d2"),),
        cdi_devices=("example.com/foo=d2",),
    )
    cp = checkpoint.decode((tmp_path / "kubelet_internal_checkpoint").read_bytes())
    assert [(e.pod_uid, e.container_name, e.devices(), e.alloc_resp) for e in cp.entries or ()] == [
        ("u1", "main", {"d2"}, b"d2")
    ]
    assert cp.registered == {FOO: ["d0", "d1", "d2"]}

    # A restarted syncloop: known but unregistered until the plugin is back; the pod
    # that holds its device is admitted as it is, a new one is refused.
    m2, _ = manager(tmp_path)
    m2.load()
    assert m2.admit("u1", p, []) is None
    assert m2.admit("u2", pod("u2", 1), [p]) == (
        "UnexpectedAdmissionError",
        "Allocate failed due to cannot allocate unregistered device example.com/foo, "
        "which is unexpected",
    )
    plugin2 = FakePlugin()
    m2.connected(FOO, plugin2, PluginOptions())
    m2.listed(FOO, plugin2, devices("Healthy", "Healthy", "Healthy"))
    again = await m2.container_options(p, p["spec"]["containers"][0])
    assert again == options and plugin2.allocated == []  # the checkpoint's answer
    other = pod("u2", 2)
    assert m2.admit("u2", other, [p]) is None
    await m2.container_options(other, other["spec"]["containers"][0])
    assert plugin2.allocated == [["d0", "d1"]]  # d2 is held
    # u1 finished: its device is free again, and the checkpoint says so.
    m2.release({"u2"})
    cp = checkpoint.decode((tmp_path / "kubelet_internal_checkpoint").read_bytes())
    assert [e.pod_uid for e in cp.entries or ()] == ["u2"]


async def test_init_container_devices_go_to_the_next_container(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    plugin = FakePlugin()
    m.connected(FOO, plugin, PluginOptions())
    m.listed(FOO, plugin, devices("Healthy", "Healthy"))
    p = pod("u", 1, init=2)
    await m.container_options(p, p["spec"]["initContainers"][0])
    await m.container_options(p, p["spec"]["containers"][0])
    assert plugin.allocated == [["d0", "d1"], ["d0"]]
    assert {k[1] for k in m.held} == {"main"}


async def test_allocation_failures_in_upstreams_words(tmp_path: Path) -> None:
    m, _ = manager(tmp_path)
    plugin = FakePlugin(fail="device plugin Allocate rpc failed with err: boom")
    m.connected(FOO, plugin, PluginOptions())
    m.listed(FOO, plugin, devices("Unhealthy"))
    p = pod("u", 1)
    with pytest.raises(
        AllocationError, match="no healthy devices present; cannot allocate unhealthy devices"
    ):
        await m.container_options(p, p["spec"]["containers"][0])
    m.listed(FOO, plugin, devices("Healthy"))
    with pytest.raises(AllocationError, match="Allocate rpc failed with err: boom"):
        await m.container_options(p, p["spec"]["containers"][0])
    assert m.held == {}
    # no device plugin resource asked: nothing to add
    assert await m.container_options(p, {"name": "x"}) is None


def test_a_corrupt_checkpoint_starts_empty(tmp_path: Path) -> None:
    (tmp_path / "kubelet_internal_checkpoint").write_bytes(b'{"Data":{},"Checksum":1}')
    m, _ = manager(tmp_path)
    m.load()
    assert m.held == {} and m.resources == {}


@pytest.mark.parametrize(
    ("registration", "says"),
    [
        (Registration("v1beta1", "foo.sock", FOO, PluginOptions()), ""),
        (
            Registration("v1alpha", "foo.sock", FOO, PluginOptions()),
            "Unsupported version 'v1alpha'",
        ),
        (
            Registration("v1beta1", "foo.sock", "cpu", PluginOptions()),
            "invalid resource name 'cpu'",
        ),
        (
            Registration("v1beta1", "foo.sock", "kubernetes.io/x", PluginOptions()),
            "invalid resource name",
        ),
        (
            Registration("v1beta1", "foo.sock", "example.com/a/b", PluginOptions()),
            "invalid resource name 'example.com/a/b': the ResourceName",
        ),
        (
            Registration("v1beta1", "../x.sock", FOO, PluginOptions()),
            "invalid endpoint '../x.sock'",
        ),
        (
            Registration("v1beta1", "kubelet.sock", FOO, PluginOptions()),
            "invalid endpoint 'kubelet.sock'",
        ),
        (Registration("v1beta1", "", FOO, PluginOptions()), "invalid endpoint ''"),
    ],
)
def test_registration_rules(registration: Registration, says: str, tmp_path: Path) -> None:
    why = validate(registration, tmp_path)
    assert (why == "") if not says else (says in why)


async def test_admission_ledger_asks_the_device_manager(tmp_path: Path) -> None:
    from klet.syncloop.admission.admit import AdmissionLedger, NodeInfo

    m, _ = manager(tmp_path)
    plugin = FakePlugin()
    m.connected(FOO, plugin, PluginOptions())
    m.listed(FOO, plugin, devices("Healthy"))
    ledger = AdmissionLedger(
        NodeInfo(name="n", labels={}, allocatable={"pods": 10, "cpu": 2000, "memory": 1 << 30}),
        devices=m,
    )
    first, second = pod("u1", 1), pod("u2", 1)
    assert ledger.decide("u1", first, others=[]).admit
    verdict = ledger.decide("u2", second, others=[first])
    assert (verdict.admit, verdict.reason) == (False, "UnexpectedAdmissionError")
    assert verdict.status_message == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        "example.com/foo. Requested: 1, Available: 0, which is unexpected"
    )


async def test_upstreams_device_plugin_metrics(tmp_path: Path) -> None:
    from klet.syncloop.devices.plugins import Registrations
    from klet.syncloop.metrics import DeviceMetrics
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    m = DeviceManager(
        tmp_path, table=FakeTable(), decode=decode, observer=DeviceMetrics.create(registry)
    )
    registrations = Registrations(m, connect=lambda _p: None, on_change=lambda: None)  # type: ignore[arg-type,return-value]
    assert await registrations.register(Registration("v0", "x.sock", FOO, PluginOptions()))
    labels = {"resource_name": FOO}
    assert registry.get_sample_value("kubelet_device_plugin_registration_total", labels) == 1
    plugin = FakePlugin()
    m.connected(FOO, plugin, PluginOptions())
    m.listed(FOO, plugin, devices("Healthy"))
    p = pod("u", 1)
    await m.container_options(p, p["spec"]["containers"][0])
    count = "kubelet_device_plugin_alloc_duration_seconds_count"
    assert registry.get_sample_value(count, labels) == 1

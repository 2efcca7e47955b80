"""Device plugins registering through the plugin watcher (klet.syncloop.devices.watched),
and the watcher's registrar handing them over (plugins/csidrivers.py).

The refusal rules, table-driven: v1beta1 must be among the versions (upstream's
message), the name an extended resource name (upstream's IsExtendedResourceName: not
`cpu`, not kubernetes.io, a qualified name), the endpoint (or, without one, the
registration socket) a normalised absolute unix socket path under the root dir's
plugins_registry/, plugins/ or device-plugins/ and not kubelet.sock. A taken plugin,
over a fake DevicePlugin client, is asked its options (GetDevicePluginOptions), followed
(ListAndWatch into the device manager: the bus counts) and withdrawn when its
registration socket vanishes (devices unhealthy); a plugin whose options cannot be read
is refused and closed; a second registration of the resource replaces the first, and
the first socket's vanishing then leaves the second in force; a kubelet.sock
registration replaces a watched one the same way. Through the registrar: a
`DevicePlugin` socket is handed to the handler and told registered (or told the
handler's refusal), an unknown type is refused naming the types taken, and a vanished
socket reaches the handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from klet.csi import PluginInfo
from klet.model.devices import Device, PluginOptions, Registration
from klet.syncloop.devices.manager import DeviceManager
from klet.syncloop.devices.plugins import Registrations
from klet.syncloop.devices.watched import DEVICE_PLUGIN, WatchedDevicePlugins, refusal
from klet.syncloop.plugins.csidrivers import CSIRegistrar

from tests.unit.syncloop.registrations import RegistrationSocket
from tests.unit.syncloop.registrations import registrar as handing_registrar
from tests.unit.syncloop.test_device_manager import FakeTable, decode

ROOT = Path("/var/lib/klet")
SOCK = ROOT / "plugins_registry" / "dp.1700000000"
FOO = "example.com/resource"


def info(**kw: object) -> PluginInfo:
    base: dict[str, object] = {
        "type": DEVICE_PLUGIN,
        "name": FOO,
        "endpoint": "",
        "supported_versions": ("v1beta1",),
    }
    base.update(kw)
    return PluginInfo(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("plugin", "why"),
    [
        (info(), None),  # upstream's sample plugin: no endpoint, its registration socket
        (info(supported_versions=("v1alpha1", "v1beta1")), None),
        (info(endpoint=str(ROOT / "plugins" / "gpu" / "dp.sock")), None),
        (info(endpoint=f"unix://{ROOT}/device-plugins/gpu.sock"), None),
        (
            info(supported_versions=("v1alpha1",)),
            "manager version, v1beta1, is not among plugin supported versions ['v1alpha1']",
        ),
        (info(supported_versions=()), "is not among plugin supported versions []"),
        (info(name="cpu"), "invalid name of device plugin socket: the ResourceName 'cpu'"),
        (info(name="kubernetes.io/gpu"), "not an extended resource name"),
        (info(name="example.com/a/b"), "name part is not"),
        (info(name="example.com/" + "x" * 64), "name part is not"),
        (info(name="Example.com/gpu"), "prefix is not a DNS-1123 subdomain"),
        (info(name="example.com/"), "name part is not"),
        (info(endpoint="/run/containerd/containerd.sock"), "is not under /var/lib/klet/"),
        (info(endpoint=f"{ROOT}/pods/x.sock"), "is not under"),
        (info(endpoint=f"{ROOT}/device-plugins/kubelet.sock"), "the kubelet's own"),
        (info(endpoint=f"{ROOT}/plugins_registry/../x.sock"), "not a normalised path"),
        (info(endpoint="dp.sock"), "not an absolute unix socket path"),
        (info(endpoint=f"{ROOT}/plugins/x\n.sock"), "control character"),
        (info(endpoint=f"{ROOT}/plugins/" + "d" * 100), "longer than a unix socket path"),
        (info(endpoint=f"{ROOT}/plugins"), "is not under"),  # the directory itself
    ],
)
def test_refusal(plugin: PluginInfo, why: str | None) -> None:
    got = refusal(plugin, socket=SOCK, root_dir=ROOT)
    assert got is None if why is None else (got is not None and why in got), got


class FakeDevicePlugin:
    """A device plugin's DevicePlugin API: options, a ListAndWatch fed through `lists`
    (None ends the stream)."""

    def __init__(self, *, options: PluginOptions | Exception | None = None) -> None:
        self._options = options or PluginOptions()
        self.lists: asyncio.Queue[list[Device] | None] = asyncio.Queue()
        self.closed = False

    async def options(self) -> PluginOptions:
        if isinstance(self._options, Exception):
            raise self._options
        return self._options

    async def list_and_watch(self) -> AsyncIterator[list[Device]]:
        while (devices := await self.lists.get()) is not None:
            yield devices

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return list(available)[:size]

    async def allocate(self, device_ids: Sequence[str]) -> bytes:
        return ",".join(device_ids).encode()

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        return None

    async def close(self) -> None:
        self.closed = True


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        (tmp_path / "device-plugins").mkdir()  # the checkpoint's (devices.run makes it)
        self.table = FakeTable()
        self.manager = DeviceManager(tmp_path / "device-plugins", table=self.table, decode=decode)
        self.plugins: dict[Path, FakeDevicePlugin] = {}
        self.registrations = Registrations(self.manager, connect=lambda p: self.plugins[p])
        self.handler = WatchedDevicePlugins(self.registrations, root_dir=tmp_path)

    def socket(self, name: str) -> Path:
        return self.root / "plugins_registry" / name

    def plugin(self, path: Path, **kw: object) -> FakeDevicePlugin:
        self.plugins[path] = FakeDevicePlugin(**kw)  # type: ignore[arg-type]
        return self.plugins[path]

    async def counts(self) -> tuple[int, int]:
        for _ in range(10):  # let the follower tasks take what was sent (no I/O: a few turns)
            await asyncio.sleep(0)
        await self.manager.publish()
        row = self.table.rows[FOO]
        return row.healthy, row.unhealthy


HEALTHY = [Device("Dev-1", "Healthy"), Device("Dev-2", "Healthy")]


async def test_a_watched_plugin_is_followed_and_withdrawn_with_its_socket(tmp_path: Path) -> None:
    node = Node(tmp_path)
    sock = node.socket("dp.1")
    plugin = node.plugin(sock, options=PluginOptions(pre_start_required=True))
    assert await node.handler.register(info(), sock) is None
    assert node.manager.resources[FOO].options == PluginOptions(pre_start_required=True)
    plugin.lists.put_nowait(HEALTHY)
    assert await node.counts() == (2, 0)
    await node.handler.deregister(sock)
    assert await node.counts() == (0, 2)  # unhealthy for the grace period
    assert node.manager.counts()[FOO].registered is False
    await node.registrations.stop()


async def test_unreadable_options_refuse_the_plugin(tmp_path: Path) -> None:
    node = Node(tmp_path)
    sock = node.socket("dp.1")
    plugin = node.plugin(sock, options=RuntimeError("connection refused"))
    why = await node.handler.register(info(), sock)
    assert why is not None and "failed to get device plugin options" in why
    assert "connection refused" in why
    assert plugin.closed and FOO not in node.manager.resources


async def test_a_refused_plugin_is_never_connected(tmp_path: Path) -> None:
    node = Node(tmp_path)
    why = await node.handler.register(info(name="cpu"), node.socket("dp.1"))
    assert why is not None and "'cpu'" in why
    assert node.manager.resources == {} and node.registrations.followers == {}


async def test_a_second_registration_replaces_the_first(tmp_path: Path) -> None:
    node = Node(tmp_path)
    first, second = node.socket("dp.1"), node.socket("dp.2")
    old, new = node.plugin(first), node.plugin(second)
    assert await node.handler.register(info(), first) is None
    old.lists.put_nowait(HEALTHY)
    assert await node.counts() == (2, 0)
    assert await node.handler.register(info(), second) is None
    new.lists.put_nowait(HEALTHY[:1])
    assert await node.counts() == (1, 0)
    assert old.closed  # the first one's stream was cancelled and its channel closed
    await node.handler.deregister(first)  # the stale socket goes: the second stays
    assert await node.counts() == (1, 0)
    assert node.manager.counts()[FOO].registered
    await node.handler.deregister(second)
    assert await node.counts() == (0, 1)
    await node.registrations.stop()


async def test_a_kubelet_sock_registration_replaces_a_watched_one(tmp_path: Path) -> None:
    node = Node(tmp_path)
    sock = node.socket("dp.1")
    node.plugin(sock).lists.put_nowait(HEALTHY)
    assert await node.handler.register(info(), sock) is None
    assert await node.counts() == (2, 0)
    direct = node.plugin(tmp_path / "device-plugins" / "foo.sock")
    assert (
        await node.registrations.register(Registration("v1beta1", "foo.sock", FOO, PluginOptions()))
        == ""
    )
    direct.lists.put_nowait(HEALTHY[:1])
    assert await node.counts() == (1, 0)
    await node.handler.deregister(sock)  # the watched socket goes: the direct one stays
    assert await node.counts() == (1, 0)
    await node.registrations.stop()


def registrar(node: Node, sockets: dict[Path, RegistrationSocket]) -> CSIRegistrar:
    return handing_registrar(sockets, {DEVICE_PLUGIN: node.handler})


async def test_the_registrar_hands_device_plugins_over_and_tells_them(tmp_path: Path) -> None:
    node = Node(tmp_path)
    good, bad, other = node.socket("dp.1"), node.socket("dp.2"), node.socket("dra.sock")
    node.plugin(good).lists.put_nowait(HEALTHY)
    sockets = {
        good: RegistrationSocket(info()),
        bad: RegistrationSocket(info(name="example.com/" + "x" * 64)),
        other: RegistrationSocket(info(type="DRAPlugin", name="dra.example.com")),
    }
    reg = registrar(node, sockets)
    for path in (good, bad, other):
        assert await reg.register(path)
    assert sockets[good].told == [(True, "")]
    [(registered, why)] = sockets[bad].told
    assert not registered and "invalid name of device plugin socket" in why
    [(registered, why)] = sockets[other].told
    assert not registered and why == (
        "plugin type 'DRAPlugin' is not supported by klet (only CSIPlugin, DevicePlugin)"
    )
    assert await node.counts() == (2, 0)
    await reg.deregister(good)
    assert await node.counts() == (0, 2)
    await node.registrations.stop()

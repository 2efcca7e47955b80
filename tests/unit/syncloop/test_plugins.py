"""The plugin watcher and the CSI registrar (klet.syncloop.plugins).

Watcher, over a real directory with real unix sockets: a new socket is registered once,
a vanished or re-created one is deregistered (and a re-created one registered again),
a plugin that could not be reached is retried after `retry_s`, non-sockets are ignored.
Registrar, with fakes of its three small interfaces: a CSI plugin of version 1.x is
asked NodeGetInfo, recorded by driver name and told it was registered; any other type,
no name, no 1.x version, a NodeGetInfo refusal or no node ID is told why and not
recorded; a bus outage is retried; a vanished socket's driver leaves the table at the
reconcile that follows, a restart's first reconcile drops drivers whose socket is gone
and keeps those registered again. Names and endpoints: a driver name the apiserver would
refuse (a path, too long) and an endpoint that is not a normalised absolute unix socket
path are refused; a second registration of a registered name is refused unless its
highest version is higher (upstream's ValidatePlugin), a higher one supersedes it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from klet.bus import BusUnavailable, NodeBus
from klet.csi import CSIError, DriverUnavailable, NodeInfo, PluginInfo
from klet.model.records import CSIDriverRecord
from klet.syncloop.metrics import plugin_counts
from klet.syncloop.plugins.csidrivers import CSIRegistrar, refusal
from klet.syncloop.plugins.watcher import PluginWatcher
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry


class Registrar:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.reachable = True

    async def register(self, sock: Path) -> bool:
        self.calls.append(("register", sock.name))
        return self.reachable

    async def deregister(self, sock: Path) -> None:
        self.calls.append(("deregister", sock.name))

    async def reconcile(self, present: frozenset[Path]) -> None:
        self.calls.append(("reconcile", ",".join(sorted(p.name for p in present))))


def listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


async def test_the_watcher_follows_the_sockets_in_the_directory(tmp_path: Path) -> None:
    reg = Registrar()
    w = PluginWatcher(tmp_path, reg, retry_s=5.0)
    a = listen(tmp_path / "a.sock")
    (tmp_path / "not-a-socket").write_text("x")
    await w.run_once(0.0)
    assert reg.calls == [("register", "a.sock"), ("reconcile", "a.sock")]
    reg.calls.clear()
    await w.run_once(1.0)
    assert reg.calls == [("reconcile", "a.sock")]  # registered once
    # Re-created: a new socket, a new registration.
    a.close()
    (tmp_path / "a.sock").unlink()
    a = listen(tmp_path / "a.sock")
    reg.calls.clear()
    await w.run_once(2.0)
    assert reg.calls == [("deregister", "a.sock"), ("register", "a.sock"), ("reconcile", "a.sock")]
    # Gone.
    a.close()
    (tmp_path / "a.sock").unlink()
    reg.calls.clear()
    await w.run_once(3.0)
    assert reg.calls == [("deregister", "a.sock"), ("reconcile", "")]


async def test_an_unreachable_plugin_is_retried_later(tmp_path: Path) -> None:
    reg = Registrar()
    reg.reachable = False
    w = PluginWatcher(tmp_path, reg, retry_s=5.0)
    s = listen(tmp_path / "b.sock")
    try:
        await w.run_once(0.0)
        await w.run_once(1.0)
        assert [c for c in reg.calls if c[0] == "register"] == [("register", "b.sock")]
        reg.reachable = True
        await w.run_once(5.0)
        await w.run_once(6.0)
        assert [c for c in reg.calls if c[0] == "register"] == [("register", "b.sock")] * 2
        assert w.known.keys() == {tmp_path / "b.sock"}
    finally:
        s.close()


async def test_a_missing_directory_is_no_plugin(tmp_path: Path) -> None:
    reg = Registrar()
    await PluginWatcher(tmp_path / "none", reg).run_once(0.0)
    assert reg.calls == [("reconcile", "")]


def info(**kw: object) -> PluginInfo:
    base: dict[str, object] = {
        "type": "CSIPlugin",
        "name": "hostpath.csi.k8s.io",
        "endpoint": "/var/lib/kubelet/plugins/hostpath/csi.sock",
        "supported_versions": ("1.0.0",),
    }
    base.update(kw)
    return PluginInfo(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("plugin", "why"),
    [
        (info(), None),
        (info(supported_versions=("v1.2.0", "0.3.0")), None),
        (info(type="DRAPlugin"), "plugin type 'DRAPlugin' is not supported"),
        (info(name=""), "no driver name"),
        (info(supported_versions=("0.3.0",)), "(0.3.0) is 1.x"),
        (info(supported_versions=()), "(none) is 1.x"),
        (info(name="Hostpath.CSI.k8s.io"), None),  # checked lowercased, as the apiserver does
        (info(name="../../../../etc"), "is not a DNS-1123 subdomain"),
        (info(name="a/b"), "is not a DNS-1123 subdomain"),
        (info(name="drv_1"), "is not a DNS-1123 subdomain"),
        (info(name="x" * 64), "longer than 63 characters"),
        (info(endpoint="unix:///var/lib/kubelet/plugins/hp/csi.sock"), None),
        (info(endpoint=""), None),  # the registration socket's path is used
        (info(endpoint="csi.sock"), "is not an absolute unix socket path"),
        (info(endpoint="tcp://10.0.0.1:9000"), "is not an absolute unix socket path"),
        (info(endpoint="/var/lib/kubelet/plugins/../../../run/x.sock"), "not a normalised"),
        (info(endpoint="/var/lib//x.sock"), "not a normalised"),
        (info(endpoint="/x\n.sock"), "control character"),
        (info(endpoint="/" + "d" * 107), "longer than a unix socket path"),
    ],
)
def test_refusal(plugin: PluginInfo, why: str | None) -> None:
    got = refusal(plugin, socket="/var/lib/kubelet/plugins_registry/hp-reg.sock")
    assert got is None if why is None else (got is not None and why in got)


class Plugin:
    """A registration socket's answers, and what it was told."""

    def __init__(self, answer: PluginInfo | CSIError) -> None:
        self.answer = answer
        self.told: list[tuple[bool, str]] = []
        self.closed = False

    async def get_info(self) -> PluginInfo:
        if isinstance(self.answer, CSIError):
            raise self.answer
        return self.answer

    async def notify(self, *, registered: bool, error: str = "") -> None:
        self.told.append((registered, error))

    async def close(self) -> None:
        self.closed = True


class Driver:
    def __init__(self, answer: NodeInfo | CSIError) -> None:
        self.answer = answer
        self.closed = False

    async def node_info(self) -> NodeInfo:
        if isinstance(self.answer, CSIError):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        self.closed = True


class World:
    def __init__(self) -> None:
        self.bus = FakeBus()
        self.table = NodeBus.of(self.bus, service="syncloop").csidrivers
        self.plugins: dict[Path, Plugin] = {}
        self.drivers: dict[str, Driver] = {}
        self.registrar = CSIRegistrar(
            self.table,
            registration=lambda p: self.plugins[p],
            driver=lambda e: self.drivers[e],
            clock=lambda: 100.0,
        )

    def rows(self) -> dict[str, CSIDriverRecord]:
        return self.bus.rows(self.table)


NODE = NodeInfo(node_id="node-a", max_volumes_per_node=8, topology={"topology.hostpath/node": "a"})
SOCK = Path("/reg/hostpath-reg.sock")
ENDPOINT = "/var/lib/kubelet/plugins/hostpath/csi.sock"


async def test_a_csi_driver_is_recorded_and_told() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info())
    w.drivers[ENDPOINT] = Driver(NODE)
    assert await w.registrar.register(SOCK)
    assert w.rows() == {
        "hostpath.csi.k8s.io": CSIDriverRecord(
            name="hostpath.csi.k8s.io",
            endpoint=ENDPOINT,
            registration=str(SOCK),
            node_id="node-a",
            max_volumes=8,
            topology={"topology.hostpath/node": "a"},
            versions="1.0.0",
            registered_at=100.0,
        )
    }
    assert w.plugins[SOCK].told == [(True, "")]
    assert w.plugins[SOCK].closed and w.drivers[ENDPOINT].closed


@pytest.mark.parametrize(
    ("plugin", "driver", "reached", "told"),
    [
        (info(type="DevicePlugin"), NODE, True, "plugin type 'DevicePlugin'"),
        (info(), CSIError("NodeGetInfo: INTERNAL: boom", code="INTERNAL"), True, "boom"),
        (info(), NodeInfo(node_id="", max_volumes_per_node=0), True, "gave no node ID"),
        (info(), DriverUnavailable("gone", code="UNAVAILABLE"), False, "gone"),
    ],
)
async def test_what_cannot_be_taken_is_told_and_not_recorded(
    plugin: PluginInfo, driver: NodeInfo | CSIError, reached: bool, told: str
) -> None:
    w = World()
    w.plugins[SOCK] = Plugin(plugin)
    w.drivers[ENDPOINT] = Driver(driver)
    assert await w.registrar.register(SOCK) is reached
    assert w.rows() == {}
    [(registered, error)] = w.plugins[SOCK].told
    assert not registered and told in error


async def test_a_plugin_that_does_not_answer_is_retried_untold() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(DriverUnavailable("GetInfo: UNAVAILABLE", code="UNAVAILABLE"))
    assert not await w.registrar.register(SOCK)
    assert w.plugins[SOCK].told == []


async def test_a_bus_outage_is_retried_and_the_plugin_waits() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info())
    w.drivers[ENDPOINT] = Driver(NODE)
    w.bus.error = BusUnavailable("down")
    assert not await w.registrar.register(SOCK)
    assert w.plugins[SOCK].told == []
    w.bus.error = None
    assert await w.registrar.register(SOCK)
    assert list(w.rows()) == ["hostpath.csi.k8s.io"]


async def test_a_vanished_socket_takes_its_driver_out_at_the_next_reconcile() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info())
    w.drivers[ENDPOINT] = Driver(NODE)
    await w.registrar.register(SOCK)
    await w.registrar.reconcile(frozenset({SOCK}))
    assert list(w.rows()) == ["hostpath.csi.k8s.io"]
    await w.registrar.deregister(SOCK)
    await w.registrar.reconcile(frozenset())
    assert w.rows() == {}


async def test_after_a_restart_only_what_registered_again_stays() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info())
    w.drivers[ENDPOINT] = Driver(NODE)
    await w.registrar.register(SOCK)
    gone = CSIDriverRecord(
        name="gone.csi",
        endpoint="/x",
        registration="/reg/gone.sock",
        node_id="n",
        max_volumes=0,
        topology={},
        versions="1.0.0",
        registered_at=1.0,
    )
    w.bus.seed(w.table, "gone.csi", gone)
    # A new process: nothing registered by it yet; the first scan registers what is there.
    fresh = CSIRegistrar(
        w.table, registration=lambda p: w.plugins[p], driver=lambda e: w.drivers[e]
    )
    await fresh.register(SOCK)
    await fresh.reconcile(frozenset({SOCK}))
    assert list(w.rows()) == ["hostpath.csi.k8s.io"]


SOCK2 = Path("/reg/hostpath-reg-2.sock")
ENDPOINT2 = "/var/lib/kubelet/plugins/impostor/csi.sock"


async def test_a_registered_name_is_taken_again_only_by_a_higher_version() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info(supported_versions=("1.1.0",)))
    w.drivers[ENDPOINT] = Driver(NODE)
    assert await w.registrar.register(SOCK)
    for versions in (("1.1.0",), ("1.0.0", "0.3.0"), ("v1.1",)):
        w.plugins[SOCK2] = Plugin(info(endpoint=ENDPOINT2, supported_versions=versions))
        w.drivers[ENDPOINT2] = Driver(NODE)
        assert await w.registrar.register(SOCK2)  # done: refused and told
        [(registered, error)] = w.plugins[SOCK2].told
        assert not registered and "already registered" in error and "1.1.0" in error
        assert w.rows()["hostpath.csi.k8s.io"].endpoint == ENDPOINT  # the first one holds
    await w.registrar.reconcile(frozenset({SOCK, SOCK2}))
    assert w.rows()["hostpath.csi.k8s.io"].endpoint == ENDPOINT
    # a higher version supersedes it, and the first one's socket going takes nothing
    w.plugins[SOCK2] = Plugin(info(endpoint=ENDPOINT2, supported_versions=("1.2.0",)))
    assert await w.registrar.register(SOCK2)
    assert w.plugins[SOCK2].told == [(True, "")]
    assert w.rows()["hostpath.csi.k8s.io"].endpoint == ENDPOINT2
    await w.registrar.deregister(SOCK)
    await w.registrar.reconcile(frozenset({SOCK2}))
    assert w.rows()["hostpath.csi.k8s.io"].endpoint == ENDPOINT2


async def test_a_driver_whose_socket_went_registers_again_with_the_same_version() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info())
    w.drivers[ENDPOINT] = Driver(NODE)
    assert await w.registrar.register(SOCK)
    await w.registrar.deregister(SOCK)  # node-driver-registrar restarted: a new socket
    w.plugins[SOCK] = Plugin(info())
    assert await w.registrar.register(SOCK)
    assert w.plugins[SOCK].told == [(True, "")]


async def test_a_bad_name_or_endpoint_is_told_and_not_recorded() -> None:
    w = World()
    w.plugins[SOCK] = Plugin(info(name="../../../../etc"))
    w.drivers[ENDPOINT] = Driver(NODE)
    assert await w.registrar.register(SOCK)
    w.plugins[SOCK2] = Plugin(info(endpoint="relative/csi.sock"))
    assert await w.registrar.register(SOCK2)
    assert w.rows() == {}
    assert not w.plugins[SOCK].told[0][0] and not w.plugins[SOCK2].told[0][0]
    assert not w.drivers[ENDPOINT].closed  # the driver was never asked


async def test_plugin_manager_total_plugins_counts_both_states(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    reg = Registrar()
    reg.reachable = False
    w = PluginWatcher(tmp_path, reg, retry_s=5.0)
    plugin_counts(registry, w)

    def value(sock: str, state: str) -> float | None:
        return registry.get_sample_value(
            "plugin_manager_total_plugins",
            {"socket_path": str(tmp_path / sock), "state": state},
        )

    assert value("a.sock", "desired_state_of_world") is None  # nothing scanned yet
    a, b = listen(tmp_path / "a.sock"), listen(tmp_path / "b.sock")
    try:
        await w.run_once(0.0)  # both found, neither reachable: desired only
        assert value("a.sock", "desired_state_of_world") == 1
        assert value("b.sock", "desired_state_of_world") == 1
        assert value("a.sock", "actual_state_of_world") is None
        reg.reachable = True
        await w.run_once(5.0)  # both registered
        assert value("a.sock", "actual_state_of_world") == 1
        assert value("b.sock", "actual_state_of_world") == 1
        b.close()
        (tmp_path / "b.sock").unlink()
        await w.run_once(6.0)  # b gone from both
        assert value("b.sock", "desired_state_of_world") is None
        assert value("b.sock", "actual_state_of_world") is None
        assert value("a.sock", "actual_state_of_world") == 1
    finally:
        a.close()
        b.close()

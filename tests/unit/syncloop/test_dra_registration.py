"""DRA drivers registering through the plugin watcher (klet.syncloop.dra.registration),
and the watcher's registrar handing them over (plugins/csidrivers.py).

The refusal rules, table-driven: the versions are DRAPlugin services and the first of
klet's (v1.DRAPlugin, then v1beta1.DRAPlugin) the plugin offers is chosen, none or an
empty list refused with upstream's message; the driver name a lower-case DNS-1123
subdomain of at most 63 characters; the endpoint a normalised absolute unix socket path
under the root dir's plugins/ or plugins_registry/. Several instances of a driver are
kept and the newest is called; an instance's registration socket vanishing withdraws
it alone, the driver goes with its last one; an endpoint already registered for the
driver is refused (upstream's message). Through the registrar: a `DRAPlugin` socket is
handed over and told registered (or the refusal), and its vanishing withdraws the
driver."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.csi import PluginInfo
from klet.model.dra import DRA_PLUGIN, SERVICE_V1, SERVICE_V1BETA1
from klet.syncloop.dra.registration import DRADrivers, DriverInstance, chosen_service, refusal

from tests.unit.syncloop.registrations import RegistrationSocket
from tests.unit.syncloop.registrations import registrar as handing_registrar

ROOT = Path("/var/lib/klet")
DRIVER = "gpu.example.com"
ENDPOINT = f"{ROOT}/plugins/{DRIVER}/dra.sock"


def info(**kw: object) -> PluginInfo:
    base: dict[str, object] = {
        "type": DRA_PLUGIN,
        "name": DRIVER,
        "endpoint": ENDPOINT,
        "supported_versions": (SERVICE_V1, SERVICE_V1BETA1),
    }
    base.update(kw)
    return PluginInfo(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("versions", "chosen"),
    [
        ((SERVICE_V1, SERVICE_V1BETA1), SERVICE_V1),
        ((SERVICE_V1BETA1, SERVICE_V1), SERVICE_V1),  # klet's order, not the plugin's
        ((SERVICE_V1BETA1,), SERVICE_V1BETA1),
        (("v1alpha4.DRAPlugin", SERVICE_V1BETA1), SERVICE_V1BETA1),
        (("1.0.0",), None),
        ((), None),
    ],
)
def test_chosen_service(versions: tuple[str, ...], chosen: str | None) -> None:
    assert chosen_service(versions) == chosen


@pytest.mark.parametrize(
    ("plugin", "why"),
    [
        (info(), None),
        (info(endpoint=f"unix://{ENDPOINT}"), None),
        (info(endpoint=f"{ROOT}/plugins_registry/gpu-dra.sock"), None),
        (info(supported_versions=()), "empty list of supported gRPC services"),
        (
            info(supported_versions=("v1alpha3",)),
            "none of services supported by the plugin (['v1alpha3']) are supported by the "
            "kubelet (['v1.DRAPlugin', 'v1beta1.DRAPlugin'])",
        ),
        (info(name=""), "the plugin gave no DRA driver name"),
        (info(name="GPU.example.com"), "is not a DNS-1123 subdomain"),
        (info(name="gpu_example"), "is not a DNS-1123 subdomain"),
        (info(name="../etc"), "is not a DNS-1123 subdomain"),
        (info(name="a" * 64), "longer than 63 characters"),
        (info(endpoint=""), "the plugin gave no endpoint"),
        (info(endpoint="dra.sock"), "not an absolute unix socket path"),
        (info(endpoint=f"{ROOT}/plugins/../pods/x.sock"), "not a normalised path"),
        (info(endpoint=f"{ROOT}/plugins/x\n.sock"), "control character"),
        (info(endpoint=f"{ROOT}/plugins/" + "d" * 100), "longer than a unix socket path"),
        (info(endpoint="/run/containerd/containerd.sock"), "is not under /var/lib/klet/plugins"),
        (info(endpoint=f"{ROOT}/device-plugins/x.sock"), "is not under"),
        (info(endpoint=f"{ROOT}/plugins"), "is not under"),  # the directory itself
    ],
)
def test_refusal(plugin: PluginInfo, why: str | None) -> None:
    got = refusal(plugin, root_dir=ROOT)
    assert got is None if why is None else (got is not None and why in got), got


def drivers() -> DRADrivers[DriverInstance]:
    return DRADrivers(root_dir=ROOT, connect=lambda instance: instance)


async def test_the_newest_instance_is_called_and_each_goes_with_its_socket() -> None:
    d = drivers()
    old, new = ROOT / "plugins_registry" / "a.sock", ROOT / "plugins_registry" / "b.sock"
    other = f"{ROOT}/plugins/{DRIVER}/dra-2.sock"
    assert await d.register(info(supported_versions=(SERVICE_V1BETA1,)), old) is None
    assert d.client(DRIVER) == DriverInstance(DRIVER, Path(ENDPOINT), SERVICE_V1BETA1, old)
    assert await d.register(info(endpoint=other), new) is None
    assert d.client(DRIVER) == DriverInstance(DRIVER, Path(other), SERVICE_V1, new)
    await d.deregister(new)
    assert d.client(DRIVER).socket == old
    await d.deregister(ROOT / "plugins_registry" / "unknown.sock")
    assert d.client(DRIVER).socket == old
    await d.deregister(old)
    assert d.current(DRIVER) is None
    with pytest.raises(LookupError, match=f"DRA driver {DRIVER} is not registered"):
        d.client(DRIVER)


async def test_an_endpoint_already_registered_for_the_driver_is_refused() -> None:
    d = drivers()
    first, second = ROOT / "plugins_registry" / "a.sock", ROOT / "plugins_registry" / "b.sock"
    assert await d.register(info(), first) is None
    why = await d.register(info(), second)
    assert why == f"endpoint {ENDPOINT} already registered for DRA driver plugin {DRIVER}"
    assert [i.socket for i in d.instances[DRIVER]] == [first]
    # another driver may use its own endpoint meanwhile
    assert (
        await d.register(info(name="nic.example.com", endpoint=f"{ROOT}/plugins/n.sock"), second)
        is None
    )


async def test_a_refused_plugin_is_not_kept() -> None:
    d = drivers()
    assert await d.register(info(supported_versions=()), ROOT / "plugins_registry/a.sock")
    assert d.instances == {}


async def test_the_registrar_hands_dra_drivers_over_and_tells_them() -> None:
    d = drivers()
    good, bad = ROOT / "plugins_registry" / "good.sock", ROOT / "plugins_registry" / "bad.sock"
    sockets = {good: RegistrationSocket(info()), bad: RegistrationSocket(info(name="Bad"))}
    registrar = handing_registrar(sockets, {DRA_PLUGIN: d})
    assert await registrar.register(good)
    assert await registrar.register(bad)
    assert sockets[good].told == [(True, "")]
    [(registered, why)] = sockets[bad].told
    assert not registered and "DRA driver name 'Bad' is not a DNS-1123 subdomain" in why
    assert d.client(DRIVER).socket == good
    await registrar.deregister(good)
    assert d.current(DRIVER) is None

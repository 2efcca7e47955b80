"""The node's ResourceSlices of absent DRA drivers (klet.syncloop.dra.slices.SliceWiper,
and its apiserver adapter dra/apislices.py), driven one step at a time on a fake clock.

Covers: at start every slice of the node is deleted (the "" key); a driver whose last
instance went is wiped 30 s later, not before, and not at all when it registered again
in between; a failed deletion is retried after 1 s, then 2 s (doubling), and forgotten
once it succeeds; DRADrivers tells the wiper of a driver's first instance and of its
last going (not of a second instance's coming or going); the adapter's single DELETE of
the collection with the node's (and the driver's) field selector, 404 as done and any
other apiserver error a SliceDeleteError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.kube import Forbidden, NotFound
from klet.syncloop.dra.apislices import PATH, ApiSlices, SliceDeleteError
from klet.syncloop.dra.registration import DRADrivers, DriverInstance
from klet.syncloop.dra.slices import WIPE_DELAY_S, SliceWiper

NODE = "node1"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Api:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failures = 0

    async def delete_slices(self, node: str, driver: str) -> None:
        self.calls.append((node, driver))
        if self.failures:
            self.failures -= 1
            raise RuntimeError("apiserver down")


async def test_all_at_start_then_a_driver_that_stays_away() -> None:
    clock, api = Clock(), Api()
    wiper = SliceWiper(api, node=NODE, clock=clock)
    wiper.pending[""] = clock()  # what run() does first
    assert await wiper.run_once() is None
    assert api.calls == [(NODE, "")]
    wiper.changed("gpu.example.com", registered=False)
    clock.t += WIPE_DELAY_S - 1
    assert await wiper.run_once() == pytest.approx(1.0)
    assert api.calls == [(NODE, "")]
    clock.t += 1
    assert await wiper.run_once() is None
    assert api.calls[-1] == (NODE, "gpu.example.com")


async def test_a_driver_back_in_time_keeps_its_slices() -> None:
    clock, api = Clock(), Api()
    wiper = SliceWiper(api, node=NODE, clock=clock)
    wiper.changed("gpu.example.com", registered=False)
    clock.t += 10
    wiper.changed("gpu.example.com", registered=True)
    clock.t += WIPE_DELAY_S
    assert await wiper.run_once() is None
    assert api.calls == []


async def test_a_failed_delete_is_retried_with_a_doubling_back_off() -> None:
    clock, api = Clock(), Api()
    api.failures = 2
    wiper = SliceWiper(api, node=NODE, clock=clock)
    wiper.pending["nic.example.com"] = clock()
    assert await wiper.run_once() == pytest.approx(1.0)
    clock.t += 1
    assert await wiper.run_once() == pytest.approx(2.0)
    clock.t += 2
    assert await wiper.run_once() is None
    assert api.calls == [(NODE, "nic.example.com")] * 3
    assert wiper.pending == {}


async def test_the_registry_tells_of_a_drivers_first_and_last_instance(tmp_path: Path) -> None:
    heard: list[tuple[str, bool]] = []
    drivers: DRADrivers[DriverInstance] = DRADrivers(
        root_dir=tmp_path, connect=lambda i: i, on_change=lambda d, r: heard.append((d, r))
    )

    class Info:
        name = "gpu.example.com"
        supported_versions = ["v1.DRAPlugin"]

        def __init__(self, endpoint: str) -> None:
            self.endpoint = endpoint

    plugins = tmp_path / "plugins"
    assert await drivers.register(Info(str(plugins / "a.sock")), tmp_path / "reg-a") is None
    assert await drivers.register(Info(str(plugins / "b.sock")), tmp_path / "reg-b") is None
    await drivers.deregister(tmp_path / "reg-a")
    assert heard == [("gpu.example.com", True)]
    await drivers.deregister(tmp_path / "reg-b")
    assert heard == [("gpu.example.com", True), ("gpu.example.com", False)]


class Kube:
    def __init__(self, answer: Any = None) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, *, params: Any = None, body: Any = None) -> Any:
        self.requests.append((method, path, params))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_the_adapter_deletes_the_collection_by_field_selector() -> None:
    kube = Kube({"kind": "ResourceSliceList"})
    await ApiSlices(kube).delete_slices(NODE, "gpu.example.com")
    await ApiSlices(kube).delete_slices(NODE, "")
    assert kube.requests == [
        ("DELETE", PATH, {"fieldSelector": "spec.nodeName=node1,spec.driver=gpu.example.com"}),
        ("DELETE", PATH, {"fieldSelector": "spec.nodeName=node1"}),
    ]
    await ApiSlices(Kube(NotFound("not found", status=404))).delete_slices(NODE, "")
    with pytest.raises(SliceDeleteError, match="forbidden"):
        await ApiSlices(Kube(Forbidden("forbidden", status=403))).delete_slices(NODE, "")

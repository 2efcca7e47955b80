"""Which supervised root tasks the service runs for a given configuration: the pod
view's two loops and the private port always, the healthz listener unless its port is
0, the read-only API only when its port is set."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from klet.bus import NodeBus
from klet.status_reporter.app import root_tasks, when_elected
from klet.status_reporter.wiring import Deps, Overrides, build_deps
from klet.testbed.fakes.bus import FakeBus
from prometheus_client import CollectorRegistry

from tests.unit.status_reporter.helpers import KletCfg


@dataclass(frozen=True)
class KubeletCfg:
    read_only_port: int
    healthz_port: int
    address: str = "0.0.0.0"
    healthz_bind_address: str = "127.0.0.1"


@dataclass(frozen=True)
class Settings:
    kubelet: KubeletCfg
    klet: KletCfg = KletCfg()


def deps_for(kubelet: KubeletCfg) -> Deps:
    """The service's dependencies over an in-memory bus, for `kubelet`'s ports."""
    bus = FakeBus()
    node = NodeBus.of(bus, service="status-reporter")
    return build_deps(
        Settings(kubelet),
        overrides=Overrides(
            bus=bus,
            lease_holder="test",
            desired=node.desired,
            status=node.status,
            feed=node.podstatus,
            registry=CollectorRegistry(),
        ),
    )


def task_names(*, read_only_port: int, healthz_port: int) -> list[str]:
    tasks = root_tasks(
        deps_for(KubeletCfg(read_only_port=read_only_port, healthz_port=healthz_port))
    )
    for coro in tasks.values():
        coro.close()  # built, never started
    return sorted(tasks)


def test_defaults_serve_healthz_but_not_the_read_only_api() -> None:
    assert task_names(read_only_port=0, healthz_port=10248) == [
        "container-log-usage",
        "device-view",
        "healthz-http",
        "lease",
        "pod-history",
        "pod-view-reload",
        "podstatus-consumer",
        "service-http",
        "volume-view",
    ]


def test_read_only_on_and_healthz_off() -> None:
    assert task_names(read_only_port=10255, healthz_port=0) == [
        "container-log-usage",
        "device-view",
        "lease",
        "pod-history",
        "pod-view-reload",
        "podstatus-consumer",
        "read-only-http",
        "service-http",
        "volume-view",
    ]


async def test_a_writer_starts_only_when_elected_and_its_other_condition_holds() -> None:
    # pod-status runs once the replica leads *and* its pod view has loaded: an empty
    # view would make every mirror pod look orphaned.
    elected, loaded = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    async def run() -> None:
        started.append("pod-status")

    task = asyncio.create_task(when_elected(elected, run, also=loaded))
    for _ in range(10):
        await asyncio.sleep(0)
    loaded.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert started == []  # loaded, but standing by
    elected.set()
    await asyncio.wait_for(task, 1)
    assert started == ["pod-status"]


def test_a_standby_creates_no_writer_coroutine() -> None:
    # cluster_tasks gives functions, not coroutines: a standby cancelled before it
    # was elected leaves no "never awaited" coroutine behind (warnings are errors here).
    elected = asyncio.Event()
    calls: list[str] = []

    async def run() -> None:
        calls.append("ran")

    coro = when_elected(elected, run)
    coro.close()
    assert calls == []


async def test_the_read_only_port_opens_once_the_pod_view_settles() -> None:
    # A replica started beside a running one must not take readers before its view
    # holds the pods: with SO_REUSEPORT the kernel would hand it a share at once.
    import socket

    from klet.devstack.procs import free_port

    port = free_port()
    deps = deps_for(KubeletCfg(read_only_port=port, healthz_port=0, address="127.0.0.1"))
    tasks = root_tasks(deps)
    serving = tasks.pop("read-only-http")
    for coro in tasks.values():
        coro.close()

    def listening() -> bool:
        # Binding without SO_REUSEPORT fails while the server holds the port (no
        # connection is made, so the server has nothing to close when cancelled).
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return True
            return False

    task = asyncio.create_task(serving)
    try:
        await asyncio.sleep(0.2)
        assert not listening()
        deps.pods.settled.set()
        for _ in range(250):  # up to 5 s: turns a hang into a failure
            if listening():
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the read-only port never opened after the view settled")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

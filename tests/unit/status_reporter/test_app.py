"""Which supervised root tasks the service runs for a given configuration: the pod
view's two loops and the private port always, the healthz listener unless its port is
0, the read-only API only when its port is set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from klet.bus import NodeBus
from klet.bus.testing import FakeBus
from klet.config import RedisAuth
from klet.status_reporter.app import root_tasks
from klet.status_reporter.wiring import Overrides, build_deps
from prometheus_client import CollectorRegistry


@dataclass(frozen=True)
class KubeletCfg:
    read_only_port: int
    healthz_port: int
    address: str = "0.0.0.0"
    healthz_bind_address: str = "127.0.0.1"


@dataclass(frozen=True)
class KletCfg:
    redis_url: str = "redis://127.0.0.1:1/0"
    redis_auth: RedisAuth = RedisAuth()
    node_name: str = "node1"
    service_port: int = 0
    service_bind_address: str = "127.0.0.1"
    run_dir: Path = Path("/nonexistent")  # unused: the tests name the lease holder


@dataclass(frozen=True)
class Settings:
    kubelet: KubeletCfg
    klet: KletCfg = KletCfg()


def task_names(*, read_only_port: int, healthz_port: int) -> list[str]:
    bus = FakeBus()
    node = NodeBus.of(bus)
    deps = build_deps(
        Settings(KubeletCfg(read_only_port=read_only_port, healthz_port=healthz_port)),
        overrides=Overrides(
            bus=bus,
            lease_holder="test",
            desired=node.desired,
            status=node.status,
            feed=node.podstatus,
            registry=CollectorRegistry(),
        ),
    )
    tasks = root_tasks(deps)
    for coro in tasks.values():
        coro.close()  # built, never started
    return sorted(tasks)


def test_defaults_serve_healthz_but_not_the_read_only_api() -> None:
    assert task_names(read_only_port=0, healthz_port=10248) == [
        "healthz-http",
        "lease",
        "pod-view-reload",
        "podstatus-consumer",
        "service-http",
    ]


def test_read_only_on_and_healthz_off() -> None:
    assert task_names(read_only_port=10255, healthz_port=0) == [
        "lease",
        "pod-view-reload",
        "podstatus-consumer",
        "read-only-http",
        "service-http",
    ]

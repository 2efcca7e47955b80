"""Cluster-mode wiring: without a kubeconfig nothing of cluster mode is built; with one
(here: fakes through `ClusterOverrides`) the four root tasks are added, settings map to
the node configuration and the required pod sources, and the managers running together
register the Node, hold the Lease, mirror a static pod and post an event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from klet.bus import NodeBus
from klet.bus.leader import hold
from klet.config import KletSettings, KubeletConfiguration, Settings
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import DesiredPod
from klet.status_reporter.app import root_tasks, when_elected
from klet.status_reporter.cluster.capacity import MachineInfo
from klet.status_reporter.cluster.eventsink import EventPolicy
from klet.status_reporter.cluster.kubeapi import NO_RETRY
from klet.status_reporter.cluster.managers import (
    ClusterOverrides,
    cluster_tasks,
    node_config,
)
from klet.status_reporter.cluster.nodelease import LeasePolicy
from klet.status_reporter.cluster.nodemanager import NodeStatusPolicy
from klet.status_reporter.cluster.podsync import PodSyncPolicy
from klet.status_reporter.pods.podcache import CachePolicy
from klet.status_reporter.wiring import Overrides, build_deps
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.status_reporter import (
    FakeApiServer,
    FakeRuntime,
    desired_record,
    make_static_pod,
)
from prometheus_client import CollectorRegistry


def settings(**kubelet: object) -> Settings:
    return Settings(
        kubelet=KubeletConfiguration(**kubelet),  # type: ignore[arg-type]
        klet=KletSettings(service="status-reporter", node_name="node1", kubeconfig=None),
    )


class Fakes:
    def __init__(self) -> None:
        self.kube = FakeApiServer()
        self.bus = FakeBus()
        self.node = NodeBus.of(self.bus, service="status-reporter")

    def overrides(self, *, cluster: bool) -> Overrides:
        fast = BackoffPolicy(0.001, 0.01)
        return Overrides(
            bus=self.bus,
            lease_holder="test",
            desired=self.node.desired,
            status=self.node.status,
            feed=self.node.podstatus,
            registry=CollectorRegistry(),
            policy=CachePolicy(reload_interval_s=0.02, read_block_ms=2),
            cluster=ClusterOverrides(
                kube=self.kube,
                lease_kube=self.kube,
                runtime=FakeRuntime(),
                conditions=self.node.node,
                sources=self.node.sources,
                events=self.node.events,
                publisher=self.node.events,
                read_machine=lambda: MachineInfo(
                    cpus=1, memory_bytes=2**30, ephemeral_storage_bytes=2**30
                ),
                node_ips=("10.0.0.9",),
                retry=NO_RETRY,
                node_policy=NodeStatusPolicy(update_frequency_s=0.02, register_backoff=fast),
                lease_policy=LeasePolicy(duration_s=0, backoff=fast),
                pod_policy=PodSyncPolicy(resync_s=0.02, min_resync_gap_s=0.01),
                event_policy=EventPolicy(qps=0, read_block_ms=2, bus_backoff=fast),
            )
            if cluster
            else None,
        )


def names(tasks: dict[str, object]) -> list[str]:
    for coro in tasks.values():
        coro.close()  # type: ignore[attr-defined]
    return sorted(tasks)


def test_standalone_builds_no_cluster_mode() -> None:
    deps = build_deps(settings(), overrides=Fakes().overrides(cluster=False))
    assert deps.cluster is None
    assert "node-status" not in names(root_tasks(deps))


def test_cluster_tasks_added() -> None:
    deps = build_deps(settings(), overrides=Fakes().overrides(cluster=True))
    assert deps.cluster is not None
    got = names(root_tasks(deps))
    assert {"node-status", "node-lease", "pod-status", "events", "pod-view-reload"} <= set(got)
    assert sorted(cluster_tasks(deps.cluster)) == [
        "csinode",
        "events",
        "node-lease",
        "node-status",
        "pod-status",
    ]


def test_settings_map_to_node_config() -> None:
    cfg = KubeletConfiguration(
        port=10999,
        max_pods=30,
        local_storage_capacity_isolation=False,
    )
    klet = KletSettings(
        service="status-reporter",
        node_name="node1",
        node_labels={"a": "b"},
        root_dir=Path("/var/lib/kubelet"),
    )
    nc = node_config(cfg, klet)
    assert (nc.kubelet_port, nc.max_pods, nc.node_labels) == (10999, 30, {"a": "b"})
    assert "nodefs.available" not in nc.eviction_hard  # no storage reservation, as upstream
    assert "memory.available" in nc.eviction_hard


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_managers_together() -> None:
    fakes = Fakes()
    static = make_static_pod("etcd")
    rec = desired_record(static)
    desired = DesiredPod(rec.uid, static, "file", rec.hash, rec.seen_at)
    fakes.bus.seed(fakes.node.desired, rec.uid, desired)
    deps = build_deps(settings(), overrides=fakes.overrides(cluster=True))
    assert deps.cluster is not None
    tasks = [
        asyncio.create_task(coro, name=name)
        for name, coro in {
            "lease": hold(deps.lease, deps.elected),
            "pod-view-reload": deps.pods.run_reloader(),
            **{
                name: when_elected(deps.elected, run)
                for name, run in cluster_tasks(deps.cluster).items()
            },
        }.items()
    ]
    try:
        kube = fakes.kube
        await until(lambda: kube.get_object("/api/v1/nodes/node1") is not None, "the Node")
        await until(
            lambda: (
                kube.get_object(
                    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node1"
                )
                is not None
            ),
            "the Lease",
        )
        await until(
            lambda: kube.get_object("/api/v1/namespaces/default/pods/etcd-node1") is not None,
            "the mirror pod",
        )
        # The node manager's own events ("Starting", "NodeReady", ...) go to the bus's
        # events stream, which the event sink posts.
        await until(lambda: any("/events/node1." in k for k in kube.objects), "the Starting event")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await deps.close()

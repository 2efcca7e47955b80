"""Two status-reporter replicas on one bus and one apiserver: only the holder of the
"status-reporter" lease writes (node status, the node Lease, pod statuses, Events, the
`events` consumer group), the standby only reads (its pod view follows the tables and
the `podstatus` stream), `klet_leader` tells them apart, and when the leader dies the
standby takes over without the Node's Ready condition ever being reported False and
without posting an Event twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from klet.bus import NodeBus
from klet.config import KletSettings, KubeletConfiguration, Settings
from klet.model.flowcontrol import BackoffPolicy
from klet.model.records import EventRecord, PodStatusChange
from klet.model.types import JSON
from klet.status_reporter.app import root_tasks
from klet.status_reporter.cluster.capacity import MachineInfo
from klet.status_reporter.cluster.eventsink import EventPolicy
from klet.status_reporter.cluster.kubeapi import NO_RETRY
from klet.status_reporter.cluster.managers import ClusterOverrides
from klet.status_reporter.cluster.nodelease import LeasePolicy
from klet.status_reporter.cluster.nodemanager import NodeStatusPolicy
from klet.status_reporter.cluster.podsync import PodSyncPolicy
from klet.status_reporter.pods.podcache import CachePolicy
from klet.status_reporter.wiring import Deps, Overrides, build_deps
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.status_reporter import (
    FakeApiServer,
    FakeRuntime,
    desired_record,
    make_pod,
    status_record,
)
from prometheus_client import CollectorRegistry

from tests.unit.status_reporter.helpers import until

TTL_MS = 300
NODE_STATUS = "/api/v1/nodes/node1/status"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node1"
LEASES = "/namespaces/kube-node-lease/leases"


class Recorded:
    """One replica's apiserver client: the shared fake apiserver, with a log of what
    this replica asked of it."""

    def __init__(self, kube: FakeApiServer) -> None:
        self.kube = kube
        self.calls: list[tuple[str, str, Any]] = []

    async def get(self, path: str, **params: Any) -> Any:
        self.calls.append(("GET", path, None))
        return await self.kube.get(path, **params)

    async def create(self, path: str, body: JSON) -> Any:
        self.calls.append(("POST", path, body))
        return await self.kube.create(path, body)

    async def replace(self, path: str, body: JSON) -> Any:
        self.calls.append(("PUT", path, body))
        return await self.kube.replace(path, body)

    async def patch(self, path: str, body: Any, *, kind: str = "strategic") -> Any:
        self.calls.append(("PATCH", path, body))
        return await self.kube.patch(path, body, kind=kind)

    async def delete(self, path: str, body: JSON | None = None) -> Any:
        self.calls.append(("DELETE", path, body))
        return await self.kube.delete(path, body)

    def writes(self, path_part: str = "") -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] != "GET" and path_part in c[1]]


class Replica:
    def __init__(self, name: str, redis: FakeBus, kube: FakeApiServer) -> None:
        self.name = name
        self.bus = redis.connect()  # its own connection, as each process has
        self.api = Recorded(kube)
        self.registry = CollectorRegistry()
        fast = BackoffPolicy(0.001, 0.01)
        self.deps: Deps = build_deps(
            Settings(
                kubelet=KubeletConfiguration(healthz_port=0),
                klet=KletSettings(service="status-reporter", node_name="node1"),
            ),
            overrides=Overrides(
                bus=self.bus,
                lease_holder=f"{name}:1:000000000000",
                lease_ttl_ms=TTL_MS,
                registry=self.registry,
                policy=CachePolicy(reload_interval_s=0.02, read_block_ms=5),
                cluster=ClusterOverrides(
                    kube=self.api,
                    lease_kube=self.api,
                    runtime=FakeRuntime(),
                    read_machine=lambda: MachineInfo(
                        cpus=1, memory_bytes=2**30, ephemeral_storage_bytes=2**30
                    ),
                    node_ips=("10.0.0.9",),
                    retry=NO_RETRY,
                    node_policy=NodeStatusPolicy(update_frequency_s=0.02, register_backoff=fast),
                    lease_policy=LeasePolicy(duration_s=1, backoff=fast),
                    pod_policy=PodSyncPolicy(resync_s=0.02, min_resync_gap_s=0.01),
                    event_policy=EventPolicy(qps=0, read_block_ms=5, bus_backoff=fast),
                ),
            ),
        )
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        coros: dict[str, Coroutine[Any, Any, None]] = root_tasks(self.deps)
        for name in [n for n in coros if n.endswith("-http") or n == "kubelet-api"]:
            coros.pop(name).close()  # no sockets in unit tests
        self.tasks = [asyncio.create_task(c, name=f"{self.name}/{n}") for n, c in coros.items()]

    async def kill(self) -> None:
        """Stop every task at once, releasing nothing (SIGKILL)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    @property
    def leading(self) -> float | None:
        return self.registry.get_sample_value("klet_leader", {"service": "status-reporter"})

    def group_calls(self) -> list[str]:
        return [c for c in self.bus.calls if c in ("ensure_group", "read", "claim_stale", "ack")]


def ready_reports(replica: Replica) -> list[str]:
    """The Ready condition statuses of every node status PATCH this replica sent."""
    out = []
    for _verb, _path, body in replica.api.writes(NODE_STATUS):
        for c in (body.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready":
                out.append(c["status"])
    return out


async def test_only_the_lease_holder_writes_and_the_standby_takes_over() -> None:
    redis, kube = FakeBus(), FakeApiServer()
    web = make_pod("web")
    rec = desired_record(web)
    redis.seed(NodeBus.of(redis, service="status-reporter").desired, rec.uid, rec)
    a, b = Replica("a", redis, kube), Replica("b", redis, kube)
    node = NodeBus.of(redis, service="status-reporter")
    try:
        a.start()
        await until(lambda: a.leading == 1, what="a leading")
        b.start()
        await until(lambda: kube.get_object(LEASE) is not None, what="the node Lease")
        await until(lambda: len(a.api.writes(NODE_STATUS)) >= 1, what="a node status report")
        redis.append(
            node.events,
            EventRecord(
                type="Normal",
                reason="Pulled",
                message="pulled",
                involved={"kind": "Pod", "namespace": "default", "name": "web", "uid": rec.uid},
                component="kubelet",
                at=1000.0,
            ),
        )
        await until(
            lambda: any(o.get("reason") == "Pulled" for o in kube.objects.values()),
            what="the Event posted",
        )
        # The standby's view follows the stream too (no consumer group shares it out).
        status = status_record(web, version=1)
        redis.seed(node.status, rec.uid, status)
        redis.append(node.podstatus, PodStatusChange(uid=rec.uid, version=1))
        for replica in (a, b):
            await until(lambda r=replica: rec.uid in r.deps.pods.statuses(), what="both views")
        await until(lambda: b.bus.calls.count("acquire") >= 3, what="b trying for the lease")

        assert (a.leading, b.leading) == (1, 0)
        assert b.api.calls == []  # not even a GET: nothing of cluster mode runs
        assert b.group_calls() == [] and "write" not in b.bus.calls
        assert a.group_calls() and a.api.writes(LEASES)

        await a.kill()  # no release: b waits for the lease to expire
        await until(lambda: b.leading == 1, what="b leading")
        await until(lambda: len(b.api.writes(NODE_STATUS)) >= 1, what="b reporting node status")
        await until(lambda: bool(b.api.writes(LEASE)), what="b renewing the node Lease")
        assert set(ready_reports(a) + ready_reports(b)) == {"True"}
        pulled = [o for o in kube.objects.values() if o.get("reason") == "Pulled"]
        assert len(pulled) == 1 and pulled[0]["count"] == 1
        assert not [c for c in b.api.writes("/events") if c[2].get("reason") == "Pulled"]
    finally:
        for replica in (a, b):
            await replica.kill()
            with contextlib.suppress(Exception):
                await replica.deps.close()


async def test_losing_the_lease_ends_the_replica() -> None:
    # Another holder takes the key (the lease expired while this replica was paused, say):
    # the lease task raises, which ends the process under run_supervised.
    redis, kube = FakeBus(), FakeApiServer()
    a = Replica("a", redis, kube)
    try:
        a.start()
        await until(lambda: a.leading == 1, what="a leading")
        lease_task = next(t for t in a.tasks if t.get_name() == "a/lease")
        key = a.deps.lease.key
        redis.strings[key] = "someone-else:1:000000000000:99"
        await until(lease_task.done, what="the lease task to end")
        assert type(lease_task.exception()).__name__ == "LeaseLost"
    finally:
        await a.kill()
        await a.deps.close()

"""The node Lease: created when missing (holder, duration, MicroTime renewTime, owner
reference to the Node once its UID is known), renewed with the last resourceVersion,
re-read after a conflict or deletion, and a renewal loop that backs off through an
outage, logs it once, and resumes as soon as the apiserver answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from klet.kube import Conflict, KubeError
from klet.model.flowcontrol import BackoffPolicy
from klet.status_reporter.cluster.kubeapi import NO_RETRY, KubeApi
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.status_reporter.cluster.nodelease import (
    LeaseManager,
    LeasePolicy,
    new_lease,
    renewed,
)
from klet.testbed.fakes.status_reporter import FakeApiServer

LEASE = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node1"


def test_new_and_renewed() -> None:
    lease = new_lease("node1", duration_s=40, now=0.0, node_uid=None)
    assert lease["spec"] == {
        "holderIdentity": "node1",
        "leaseDurationSeconds": 40,
        "renewTime": "1970-01-01T00:00:00.000000Z",
    }
    assert "ownerReferences" not in lease["metadata"]
    again = renewed(lease, "node1", duration_s=40, now=10.0, node_uid="n-1")
    assert again["spec"]["renewTime"] == "1970-01-01T00:00:10.000000Z"
    assert again["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "n-1"}
    ]
    assert "ownerReferences" not in lease["metadata"]  # the input is not modified


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def manager(kube: FakeApiServer, identity: NodeIdentity, now: list[float]) -> LeaseManager:
    return LeaseManager(
        api=KubeApi(kube, retry=NO_RETRY),
        identity=identity,
        policy=LeasePolicy(duration_s=40, backoff=BackoffPolicy(0.0, 0.0)),
        clock=lambda: now[0],
    )


async def test_create_then_renew() -> None:
    kube, identity, now = FakeApiServer(), NodeIdentity("node1"), [100.0]
    identity.set_uid("n-1")
    m = manager(kube, identity, now)
    await m.renew_once()
    lease = kube.get_object(LEASE)
    assert lease is not None
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "n-1"
    now[0] = 110.0
    await m.renew_once()
    lease = kube.get_object(LEASE)
    assert lease is not None and lease["spec"]["renewTime"].startswith("1970-01-01T00:01:50")
    assert kube.count("PUT") == 1 and kube.count("POST") == 1


async def test_owner_added_later_and_conflict_rereads() -> None:
    kube, identity, now = FakeApiServer(), NodeIdentity("node1"), [0.0]
    m = manager(kube, identity, now)
    await m.renew_once()
    identity.set_uid("n-1")
    kube.fail_next("PUT", "leases", Conflict("modified"))
    with pytest.raises(KubeError):
        await m.renew_once()
    await m.renew_once()  # re-read, then renewed
    lease = kube.get_object(LEASE)
    assert lease is not None and lease["metadata"]["ownerReferences"][0]["uid"] == "n-1"


async def test_loop_survives_outage_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    kube, identity, now = FakeApiServer(), NodeIdentity("node1"), [0.0]
    m = LeaseManager(
        api=KubeApi(kube, retry=NO_RETRY),
        identity=identity,
        policy=LeasePolicy(duration_s=0, backoff=BackoffPolicy(0.001, 0.002)),
        clock=lambda: now[0],
    )
    caplog.set_level(logging.INFO)
    kube.down = True
    task = asyncio.create_task(m.run())
    try:
        await until(lambda: kube.count("GET") >= 5)
        assert m.renewed_at is None
        kube.down = False
        now[0] = 50.0
        await until(lambda: m.renewed_at == 50.0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    messages = [r.message for r in caplog.records]
    assert sum(1 for msg in messages if msg.startswith("failed to renew the node lease")) == 1
    assert "node lease renewed again" in messages

"""DRA's pod path: PodController and SyncPod with the claim manager (dra/manager.py)
over FakeRuntimeService, in-memory claims and drivers, and the real checkpoint file.

Covers: a pod's claim (made from its template, named in status.resourceClaimStatuses)
is prepared before its sandbox exists and its container gets the driver's CDI device
on CRI; a claim that cannot be prepared (not reserved for the pod yet) gives no
sandbox, upstream's FailedPrepareDynamicResources Warning, ContainerCreating and a
failed (backed-off) sync, and the next sync after the claim is reserved runs the pod;
a deleted pod's claims are unprepared only once its containers have stopped, a driver
failing that fails the sync and the next one unprepares; a restarted syncloop takes
the claims from the checkpoint and neither prepares again nor restarts a container,
and a container that dies afterwards comes back with its CDI device; a pod nobody
wants any more (removed while syncloop was away) has its claims unprepared after the
kill; without a claim manager (standalone, or the gate off) the pod waits with the
Event saying so; a pod that completed by itself (restartPolicy Never, exit 0) has its
claims unprepared once its phase is Succeeded, not at its deletion; a container's
`resources.claims` stays out of its status resources (the in-place resize's view:
limits and requests only, as upstream).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import ContainerState
from klet.model.dra import ClaimRef, PreparedDevice, PrepareResult
from klet.model.records import DesiredPod, SourceState
from klet.model.types import PodUID
from klet.syncloop.admission.admit import NodeInfo
from klet.syncloop.dra.claiminfo import CHECKPOINT_NAME, decode
from klet.syncloop.dra.manager import ClaimManager, ManagerDeps
from klet.syncloop.dra.state import ClaimCheckpoint
from klet.syncloop.model.runtimepod import RuntimePod
from klet.syncloop.pods.status import ResizeView, compute_pod_status
from klet.syncloop.wiring import Deps
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import NODE, RecordedEvents, pod, wire

DRIVER = "gpu.example.com"
CDI = f"{DRIVER}/gpu=gpu-0"
READY = {"api": SourceState(source="api", ready=True, at=0.0)}
NS = "default"


def claim_pod(uid: str = "u1") -> dict[str, Any]:
    p = pod("app", uid=uid, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{uid}-gpu"}]}
    return p


def claim(pod_uid: str, *, reserved: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{pod_uid}-gpu",
            "namespace": NS,
            "uid": f"claim-{pod_uid}",
            "ownerReferences": [{"controller": True, "uid": pod_uid, "kind": "Pod"}],
        },
        "status": {
            "reservedFor": [{"resource": "pods", "uid": pod_uid}] if reserved else [],
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER}]}},
        },
    }


class Claims:
    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        if name not in self.claims:
            raise LookupError(f'resourceclaims.resource.k8s.io "{name}" not found')
        return self.claims[name]


class Driver:
    """One registered driver: a call log shared with the runtime's (which it reads to
    say whether the pod's sandbox existed when it was called)."""

    def __init__(self, cri: FakeRuntimeService) -> None:
        self.cri = cri
        self.log: list[tuple[str, tuple[str, ...], int]] = []
        self.unprepare_error = ""

    def current(self, driver: str) -> object | None:
        return self if driver == DRIVER else None

    def client(self, driver: str) -> Driver:
        return self

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        self.log.append(("prepare", tuple(c.name for c in claims), len(self.cri.sandboxes)))
        device = PreparedDevice("pool", "gpu-0", ("gpu",), (CDI,))
        return {c.uid: PrepareResult(devices=(device,)) for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        running = sum(c.state == ContainerState.RUNNING for c in self.cri.containers.values())
        self.log.append(("unprepare", tuple(c.name for c in claims), running))
        return {c.uid: self.unprepare_error for c in claims}

    async def close(self) -> None:
        pass


class RecordingWorkers:
    """Each test drives sync_once itself: wake-ups are only recorded."""

    def wake(self, uid: str) -> None:
        pass

    def nudge(self, uid: str) -> None:
        pass

    def uids(self) -> list[str]:
        return []


class World:
    def __init__(self, tmp_path: Path, cri: FakeRuntimeService | None = None) -> None:
        self.tmp_path = tmp_path
        self.cri = cri or FakeRuntimeService()
        self.cri.add_image("registry.klet.test/busybox:1.36")
        self.events = RecordedEvents()
        node = NodeInfo(name=NODE, labels={}, allocatable={"pods": 10}, runtime_classes=True)
        self.deps: Deps = wire(tmp_path, self.cri, events=self.events, node=node, bus=FakeBus())
        self.controller = self.deps.controller
        self.controller.workers = RecordingWorkers()  # type: ignore[assignment]
        self.claims = Claims()
        self.driver = Driver(self.cri)
        self.checkpoint = ClaimCheckpoint(tmp_path / "node")
        manager = ClaimManager(
            ManagerDeps(claims=self.claims, drivers=self.driver, checkpoint=self.checkpoint)
        )
        # what wiring does in cluster mode (wire() is standalone: no apiserver)
        self.controller.syncer.claims = manager
        self.controller.syncer.starter.claims = manager

    def want(self, *pods: dict[str, Any]) -> None:
        recs = {
            p["metadata"]["uid"]: DesiredPod(
                uid=PodUID(p["metadata"]["uid"]), pod=p, source="api", hash="h", seen_at=0.0
            )
            for p in pods
        }
        self.controller.apply_desired(recs, READY, read_from=self.controller.generation)

    def checkpointed(self) -> dict[str, frozenset[str]]:
        blob = (self.tmp_path / "node" / CHECKPOINT_NAME).read_bytes()
        return {info.key: info.pod_uids for info in decode(blob)}

    def app_containers(self) -> list[Any]:
        return [c for c in self.cri.containers.values() if c.config.name == "app"]


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_a_claim_is_prepared_before_the_sandbox_and_its_cdi_device_reaches_cri(
    w: World,
) -> None:
    w.claims.claims["u1-gpu"] = claim("u1")
    w.want(claim_pod("u1"))
    outcome = await w.controller.sync_once("u1")
    assert not outcome.failed
    assert w.driver.log == [("prepare", ("u1-gpu",), 0)]  # no sandbox yet when called
    [app] = w.app_containers()
    assert app.state == ContainerState.RUNNING and app.config.cdi_devices == (CDI,)
    assert w.checkpointed() == {f"{NS}/u1-gpu": frozenset({"u1"})}


async def test_a_claim_not_reserved_yet_leaves_the_pod_waiting_with_upstreams_event(
    w: World,
) -> None:
    w.claims.claims["u1-gpu"] = claim("u1", reserved=False)
    w.want(claim_pod("u1"))
    outcome = await w.controller.sync_once("u1")
    assert outcome.failed and not w.cri.sandboxes and w.driver.log == []
    [event] = w.events.of("FailedPrepareDynamicResources")
    assert event.type == "Warning"
    assert event.message.startswith("Failed to prepare dynamic resources: ")
    assert "is not allowed to use ResourceClaim u1-gpu" in event.message
    status = w.controller.publisher.get("u1")
    assert status is not None and status["phase"] == "Pending"
    [cs] = status["containerStatuses"]
    assert cs["state"]["waiting"]["reason"] == "ContainerCreating"
    w.claims.claims["u1-gpu"] = claim("u1")  # the scheduler reserved it
    assert not (await w.controller.sync_once("u1")).failed
    assert [c.state for c in w.app_containers()] == [ContainerState.RUNNING]


async def test_a_deleted_pods_claims_are_unprepared_once_its_containers_stopped(
    w: World,
) -> None:
    w.claims.claims["u1-gpu"] = claim("u1")
    p = claim_pod("u1")
    w.want(p)
    await w.controller.sync_once("u1")
    deleting = {**p, "metadata": {**p["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    w.want(deleting)
    w.driver.unprepare_error = "device busy"
    with pytest.raises(Exception, match="device busy"):  # the worker retries the sync
        await w.controller.sync_once("u1")
    assert w.driver.log[-1] == ("unprepare", ("u1-gpu",), 0)  # no container ran by then
    w.driver.unprepare_error = ""
    await w.controller.sync_once("u1")
    assert w.driver.log[-1] == ("unprepare", ("u1-gpu",), 0)
    assert w.checkpointed() == {}
    entry = w.controller.publisher._entries["u1"]
    assert entry.terminated


async def test_a_restarted_syncloop_keeps_the_claims_without_preparing_or_restarting(
    tmp_path: Path,
) -> None:
    first = World(tmp_path)
    first.claims.claims["u1-gpu"] = claim("u1")
    first.want(claim_pod("u1"))
    await first.controller.sync_once("u1")
    [app] = first.app_containers()
    # A new syncloop over the same runtime and root dir: the checkpoint is all it has.
    second = World(tmp_path, cri=first.cri)
    second.claims.claims["u1-gpu"] = claim("u1")
    second.want(claim_pod("u1"))
    await second.controller.sync_once("u1")
    assert second.driver.log == []
    assert [c.id for c in second.app_containers()] == [app.id]
    assert app.state == ContainerState.RUNNING
    second.cri.exit_container(app.id, 1)  # its restart takes the device from the checkpoint
    await second.controller.sync_once("u1")
    restarted = [c for c in second.app_containers() if c.id != app.id]
    assert [c.config.cdi_devices for c in restarted] == [(CDI,)]
    assert second.driver.log == []


async def test_a_pod_removed_while_syncloop_was_away_has_its_claims_unprepared(
    w: World,
) -> None:
    w.claims.claims["u1-gpu"] = claim("u1")
    w.want(claim_pod("u1"))
    await w.controller.sync_once("u1")
    w.want()  # no source wants it any more
    outcome = await w.controller.sync_once("u1")
    assert outcome.done and not w.cri.containers
    assert w.driver.log[-1] == ("unprepare", ("u1-gpu",), 0)
    assert w.checkpointed() == {}


async def test_without_a_claim_manager_the_pod_waits_and_the_event_says_why(w: World) -> None:
    # wiring builds none standalone or with featureGates.DynamicResourceAllocation=false
    w.controller.syncer.claims = None
    w.claims.claims["u1-gpu"] = claim("u1")
    w.want(claim_pod("u1"))
    assert (await w.controller.sync_once("u1")).failed
    assert not w.cri.sandboxes
    message = w.events.message("FailedPrepareDynamicResources")
    assert "featureGates.DynamicResourceAllocation=false" in message
    assert "standalone" in message


def test_a_containers_claims_are_not_in_its_status_resources() -> None:
    # In-place resize shows each container's allocated resources in its status: limits
    # and requests, as upstream; `resources.claims` is a list, no resource amounts.
    p = claim_pod("u1")
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m"}
    status = compute_pod_status(
        p, RuntimePod(uid="u1"), waiting={}, previous=None, now=0.0, resize=ResizeView()
    )
    [cs] = status["containerStatuses"]
    assert cs["resources"] == {"requests": {"cpu": "100m"}}


async def test_a_pod_that_completed_by_itself_gives_its_claims_back(w: World) -> None:
    w.claims.claims["u1-gpu"] = claim("u1")
    p = claim_pod("u1")
    p["spec"]["restartPolicy"] = "Never"
    w.want(p)
    await w.controller.sync_once("u1")
    [app] = w.app_containers()
    w.cri.exit_container(app.id, 0)
    await w.controller.sync_once("u1")
    status = w.controller.publisher.get("u1")
    assert status is not None and status["phase"] == "Succeeded"
    assert w.driver.log[-1] == ("unprepare", ("u1-gpu",), 0)
    assert w.checkpointed() == {}
    await w.controller.sync_once("u1")  # later syncs have nothing left to unprepare
    assert [e[0] for e in w.driver.log] == ["prepare", "unprepare"]

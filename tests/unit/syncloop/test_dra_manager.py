"""Preparing and unpreparing a pod's claims (klet.syncloop.dra.manager.ClaimManager),
with in-memory stand-ins for the apiserver's claims, the registered drivers (a call log
and per-claim answers) and the checkpoint (each stored snapshot).

Covers: the pod's claims read, checked and batched per driver into one
NodePrepareResources each; the devices answered recorded, the container's CDI devices
from them; the pod referenced in the checkpoint before the driver is called, and the
devices after; a claim already prepared for another pod not prepared again but
referenced; a refused claim (not reserved) or an unregistered driver fails before
anything is cached or called; a driver's per-claim error named; a claim of the same
name with another UID refused; unprepare only when the last pod goes, the claim then
forgotten; a failed unprepare keeps the claim and the next unprepare retries it; the
checkpoint read at the first use, not at construction, its claims giving CDI devices
with no driver called, and an unprepare of a pod holding no claim writing nothing; a
container's claims (for the PodResources API) the prepared ones it names, an unprepared
one an error naming it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
from klet.model.dra import ClaimRef, PreparedDevice, PrepareResult
from klet.syncloop.dra.claiminfo import ClaimInfo
from klet.syncloop.dra.manager import ClaimManager, DRAPrepareError, ManagerDeps

DRIVER = "gpu.example.com"


def _claim(
    name: str, uid: str, *, reserved: Sequence[str], drivers: Sequence[str] = (DRIVER,)
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {
            "reservedFor": [{"resource": "pods", "uid": u} for u in reserved],
            "allocation": {
                "devices": {"results": [{"request": "r", "driver": d} for d in drivers]}
            },
        },
    }


def _pod(uid: str, *claims: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
        "spec": {
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": c} for c in claims]}}
            ],
        },
    }


class Claims:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        if name not in self.claims:
            raise LookupError(f"resourceclaims {name!r} not found")
        return self.claims[name]


class Driver:
    def __init__(self, name: str, log: list[tuple[str, str, tuple[str, ...]]]) -> None:
        self.name, self.log = name, log
        self.prepare_errors: dict[str, str] = {}
        self.unprepare_errors: dict[str, str] = {}

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        self.log.append((self.name, "prepare", tuple(c.name for c in claims)))
        return {
            c.uid: PrepareResult(
                devices=(
                    PreparedDevice("pool", f"dev-{c.name}", (), (f"{self.name}/x={c.name}",)),
                ),
                error=self.prepare_errors.get(c.uid, ""),
            )
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.log.append((self.name, "unprepare", tuple(c.name for c in claims)))
        return {c.uid: self.unprepare_errors.get(c.uid, "") for c in claims}

    async def close(self) -> None:
        pass


class Drivers:
    def __init__(self, *names: str) -> None:
        self.log: list[tuple[str, str, tuple[str, ...]]] = []
        self.drivers = {n: Driver(n, self.log) for n in names}

    def current(self, driver: str) -> object | None:
        return self.drivers.get(driver)

    def client(self, driver: str) -> Driver:
        if driver not in self.drivers:
            raise LookupError(f"DRA driver {driver} is not registered")
        return self.drivers[driver]


class Checkpoint:
    def __init__(self, *held: ClaimInfo) -> None:
        self.stored: list[list[ClaimInfo]] = []
        self.held = list(held)
        self.loads = 0

    def load(self) -> list[ClaimInfo]:
        self.loads += 1
        return list(self.held)

    def store(self, claims: Iterable[ClaimInfo]) -> None:
        self.stored.append(list(claims))


def _manager(claims: Claims, drivers: Drivers) -> tuple[ClaimManager, Checkpoint]:
    checkpoint = Checkpoint()
    return ClaimManager(
        ManagerDeps(claims=claims, drivers=drivers, checkpoint=checkpoint)
    ), checkpoint


async def test_a_pods_claims_are_prepared_once_per_driver_and_give_cdi_devices() -> None:
    claims = Claims(
        _claim("a", "ua", reserved=["p1"]),
        _claim("b", "ub", reserved=["p1"], drivers=[DRIVER, "nic.example.com"]),
    )
    drivers = Drivers(DRIVER, "nic.example.com")
    manager, checkpoint = _manager(claims, drivers)
    pod = _pod("p1", "a", "b")
    await manager.prepare(pod)
    assert drivers.log == [
        (DRIVER, "prepare", ("a", "b")),
        ("nic.example.com", "prepare", ("b",)),
    ]
    # Referenced before any driver was called (first snapshot), devices after (last).
    first = {i.key: i for i in checkpoint.stored[0]}
    assert first["ns/a"].pod_uids == {"p1"} and first["ns/a"].driver_state == {DRIVER: ()}
    last = {i.key: i for i in checkpoint.stored[-1]}
    assert [d.device_name for d in last["ns/b"].driver_state["nic.example.com"]] == ["dev-b"]
    assert manager.cdi_devices(pod, pod["spec"]["containers"][0]) == (
        f"{DRIVER}/x=a",
        f"{DRIVER}/x=b",
        "nic.example.com/x=b",
    )
    assert manager.prepared == {"ns/a", "ns/b"}


async def test_a_shared_claim_is_prepared_once_and_unprepared_with_its_last_pod() -> None:
    claims = Claims(_claim("a", "ua", reserved=["p1", "p2"]))
    drivers = Drivers(DRIVER)
    manager, checkpoint = _manager(claims, drivers)
    await manager.prepare(_pod("p1", "a"))
    await manager.prepare(_pod("p2", "a"))
    assert drivers.log == [(DRIVER, "prepare", ("a",))]
    assert manager.cache["ns/a"].pod_uids == {"p1", "p2"}
    await manager.unprepare("p1")
    assert len(drivers.log) == 1 and manager.cache["ns/a"].pod_uids == {"p2"}
    await manager.unprepare("p2")
    assert drivers.log[-1] == (DRIVER, "unprepare", ("a",))
    assert manager.cache == {} and manager.prepared == set()
    assert checkpoint.stored[-1] == []


async def test_nothing_is_cached_or_called_when_a_claim_cannot_be_used() -> None:
    drivers = Drivers(DRIVER)
    manager, checkpoint = _manager(Claims(_claim("a", "ua", reserved=["other"])), drivers)
    with pytest.raises(DRAPrepareError, match=r"pod pod-p1 \(p1\) is not allowed to use"):
        await manager.prepare(_pod("p1", "a"))
    manager, checkpoint = _manager(
        Claims(_claim("a", "ua", reserved=["p1"], drivers=["gone.example.com"])), drivers
    )
    with pytest.raises(DRAPrepareError, match="DRA driver gone.example.com is not registered"):
        await manager.prepare(_pod("p1", "a"))
    with pytest.raises(DRAPrepareError, match="fetch ResourceClaim missing: .*not found"):
        await manager.prepare(_pod("p1", "missing"))
    assert manager.cache == {} and checkpoint.stored == [] and drivers.log == []


async def test_a_drivers_error_and_a_reused_name_are_named() -> None:
    drivers = Drivers(DRIVER)
    drivers.drivers[DRIVER].prepare_errors["ua"] = "no such device"
    manager, _ = _manager(Claims(_claim("a", "ua", reserved=["p1"])), drivers)
    with pytest.raises(
        DRAPrepareError, match=f"ns/a by DRA driver {DRIVER} failed: no such device"
    ):
        await manager.prepare(_pod("p1", "a"))
    assert "ns/a" not in manager.prepared
    manager.deps.claims.claims["a"] = _claim("a", "ua-new", reserved=["p2"])  # type: ignore[attr-defined]
    with pytest.raises(DRAPrepareError, match="same name a and different UID ua still exists"):
        await manager.prepare(_pod("p2", "a"))


async def test_a_failed_unprepare_keeps_the_claim_and_is_retried() -> None:
    drivers = Drivers(DRIVER)
    manager, _ = _manager(Claims(_claim("a", "ua", reserved=["p1"])), drivers)
    await manager.prepare(_pod("p1", "a"))
    drivers.drivers[DRIVER].unprepare_errors["ua"] = "busy"
    with pytest.raises(DRAPrepareError, match=f"ns/a by DRA driver {DRIVER}: busy"):
        await manager.unprepare("p1")
    assert manager.cache["ns/a"].pod_uids == frozenset()
    drivers.drivers[DRIVER].unprepare_errors.clear()
    await manager.unprepare("p-other")
    assert drivers.log[-1] == (DRIVER, "unprepare", ("a",)) and manager.cache == {}


async def test_the_checkpoint_is_read_at_first_use_and_a_stranger_writes_nothing() -> None:
    held = ClaimInfo(
        claim_uid="ua",
        claim_name="a",
        namespace="ns",
        pod_uids=frozenset({"p1"}),
        driver_state={DRIVER: (PreparedDevice("pool", "dev-a", (), (f"{DRIVER}/x=a",)),)},
    )
    checkpoint = Checkpoint(held)
    drivers = Drivers(DRIVER)
    manager = ClaimManager(ManagerDeps(claims=Claims(), drivers=drivers, checkpoint=checkpoint))
    assert checkpoint.loads == 0  # a standby's manager reads nothing until it leads
    pod = _pod("p1", "a")
    assert manager.cdi_devices(pod, pod["spec"]["containers"][0]) == (f"{DRIVER}/x=a",)
    assert checkpoint.loads == 1 and drivers.log == []
    await manager.unprepare("p2")  # a pod without claims: nothing to do, nothing written
    assert checkpoint.stored == [] and drivers.log == []
    await manager.unprepare("p1")
    assert drivers.log == [(DRIVER, "unprepare", ("a",))]
    assert checkpoint.stored[-1] == [] and checkpoint.loads == 1


async def test_a_containers_claims_are_the_prepared_ones_it_names() -> None:
    claims = Claims(_claim("a", "ua", reserved=["p1"]), _claim("b", "ub", reserved=["p1"]))
    manager, _ = _manager(claims, Drivers(DRIVER))
    pod = _pod("p1", "a", "b")
    pod["spec"]["containers"].append({"name": "only-b", "resources": {"claims": [{"name": "b"}]}})
    await manager.prepare(pod)
    main, only_b = pod["spec"]["containers"]
    assert [i.claim_name for i in manager.container_claims(pod, main)] == ["a", "b"]
    assert [i.claim_name for i in manager.container_claims(pod, only_b)] == ["b"]
    other = _pod("p2", "c")
    with pytest.raises(ValueError, match="unable to get information for ResourceClaim c"):
        manager.container_claims(other, other["spec"]["containers"][0])

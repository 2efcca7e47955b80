"""upstream's DRA metrics as syncloop serves them: the claim manager
(klet.syncloop.dra.manager.ClaimManager) driven through in-memory claims, drivers and
checkpoint, with its observer and claims-in-use collector those of
klet.syncloop.metrics on a registry of the test's own.

Covers: dra_operations_duration_seconds{operation_name, is_error} observed for each
prepare and unprepare (a failed prepare too, and a pod without claims), with the
seconds the manager's clock measured and upstream's buckets, is_error as upstream's
v1.34 sets it ("true" for success); dra_resource_claims_in_use{driver_name} following
the claims prepared and unprepared, per driver and under `<any>`, a claim of two drivers
counted once in `<any>`, a driver with none left gone from the page, a checkpointed
claim not counted until prepared again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
from klet.model.dra import ClaimRef, PreparedDevice, PrepareResult
from klet.syncloop.dra.claiminfo import ClaimInfo
from klet.syncloop.dra.manager import ClaimManager, DRAPrepareError, ManagerDeps
from klet.syncloop.metrics import DRA_DURATION_BUCKETS, DRAClaimsInUse, dra_operations
from prometheus_client import CollectorRegistry, generate_latest

GPU, NIC = "gpu.example.com", "nic.example.com"


def _claim(name: str, uid: str, pod: str, *drivers: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {
            "reservedFor": [{"resource": "pods", "uid": pod}],
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
            "containers": [{"name": "main"}],
        },
    }


class Claims:
    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}

    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.claims[name]


class Driver:
    def __init__(self, name: str) -> None:
        self.name = name

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        device = PreparedDevice("pool", "dev", (), (f"{self.name}/x=dev",))
        return {c.uid: PrepareResult(devices=(device,), error="") for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return {c.uid: "" for c in claims}

    async def close(self) -> None:
        pass


class Drivers:
    def __init__(self, *names: str) -> None:
        self.drivers = {n: Driver(n) for n in names}

    def current(self, driver: str) -> object | None:
        return self.drivers.get(driver)

    def client(self, driver: str) -> Driver:
        return self.drivers[driver]


class Checkpoint:
    def __init__(self, *held: ClaimInfo) -> None:
        self.held = list(held)

    def load(self) -> list[ClaimInfo]:
        return list(self.held)

    def store(self, claims: Iterable[ClaimInfo]) -> None:
        self.held = list(claims)


class Clock:
    """Each reading 0.5 s after the one before."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def _manager(
    registry: CollectorRegistry, claims: Claims, checkpoint: Checkpoint | None = None
) -> ClaimManager:
    manager = ClaimManager(
        ManagerDeps(
            claims=claims,
            drivers=Drivers(GPU, NIC),
            checkpoint=checkpoint or Checkpoint(),
            observe=dra_operations(registry),
            clock=Clock(),
        )
    )
    DRAClaimsInUse(manager.claims_in_use, registry=registry)
    return manager


def _ops(registry: CollectorRegistry, operation: str, is_error: str, what: str) -> float | None:
    return registry.get_sample_value(
        f"dra_operations_duration_seconds_{what}",
        {"operation_name": operation, "is_error": is_error},
    )


def _in_use(registry: CollectorRegistry) -> dict[str, float]:
    found = {}
    for family in registry.collect():
        if family.name == "dra_resource_claims_in_use":
            assert family.type == "gauge"
            found = {s.labels["driver_name"]: s.value for s in family.samples}
    return found


async def test_each_prepare_and_unprepare_is_timed_by_operation_and_outcome() -> None:
    registry = CollectorRegistry()
    manager = _manager(registry, Claims(_claim("a", "ua", "p1", GPU)))
    await manager.prepare(_pod("p1", "a"))
    await manager.prepare(_pod("p0"))  # no claims: observed all the same, as upstream
    bad = _pod("p2", "a")
    bad["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimTemplateName": "t"}]
    with pytest.raises(DRAPrepareError):  # no status.resourceClaimStatuses for it
        await manager.prepare(bad)
    await manager.unprepare("p1")

    # upstream's is_error is FormatBool(err == nil): "true" when it succeeded.
    assert _ops(registry, "PrepareResources", "true", "count") == 2.0
    assert _ops(registry, "PrepareResources", "true", "sum") == 1.0  # 0.5 s each
    assert _ops(registry, "PrepareResources", "false", "count") == 1.0
    assert _ops(registry, "UnprepareResources", "true", "count") == 1.0
    assert _ops(registry, "UnprepareResources", "false", "count") is None
    page = generate_latest(registry).decode()
    assert (
        'dra_operations_duration_seconds_bucket{is_error="true",le="0.5539182980610752",'
        'operation_name="PrepareResources"} 2.0'
    ) in page
    assert 'le="39.99999999999997"' in page
    assert len(DRA_DURATION_BUCKETS) == 15


async def test_claims_in_use_follow_prepare_and_unprepare_per_driver_and_any() -> None:
    registry = CollectorRegistry()
    claims = Claims(
        _claim("a", "ua", "p1", GPU),
        _claim("b", "ub", "p1", GPU, NIC),
        _claim("c", "uc", "p2", GPU),
    )
    manager = _manager(registry, claims)
    assert _in_use(registry) == {"<any>": 0.0}

    await manager.prepare(_pod("p1", "a", "b"))
    # b uses two drivers: once for each, once in <any>.
    assert _in_use(registry) == {"<any>": 2.0, GPU: 2.0, NIC: 1.0}
    await manager.prepare(_pod("p2", "c"))
    assert _in_use(registry) == {"<any>": 3.0, GPU: 3.0, NIC: 1.0}

    await manager.unprepare("p1")
    assert _in_use(registry) == {"<any>": 1.0, GPU: 1.0}  # NIC has none: no series
    assert (
        'dra_resource_claims_in_use{driver_name="<any>"} 1.0' in generate_latest(registry).decode()
    )


async def test_a_checkpointed_claim_is_in_use_only_once_prepared_again() -> None:
    registry = CollectorRegistry()
    held = ClaimInfo(
        claim_uid="ua",
        claim_name="a",
        namespace="ns",
        pod_uids=frozenset({"p1"}),
        driver_state={GPU: ()},
    )
    manager = _manager(registry, Claims(_claim("a", "ua", "p1", GPU)), Checkpoint(held))
    assert manager.holds("p1")  # read back from the checkpoint
    assert _in_use(registry) == {"<any>": 0.0}
    await manager.prepare(_pod("p1", "a"))
    assert _in_use(registry) == {"<any>": 1.0, GPU: 1.0}

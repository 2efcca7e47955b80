"""Preparing and unpreparing a pod's ResourceClaims (upstream's DRA manager,
pkg/kubelet/cm/dra/manager.go v1.34: PrepareResources, UnprepareResources,
GetResources).

`prepare(pod)` reads each claim the pod names from the apiserver, checks it
(`claims.claim_to_prepare`: the pod's own, reserved for it, allocated) and that each of
its drivers is registered, all before touching the cache, as upstream does; then adds
the pod to each claim's info (a claim of the same name with another UID is an error:
the old one's pod was force-deleted while it was prepared) and checkpoints, so a crash
before the drivers answer still knows the pod references the claim; then calls
NodePrepareResources once per driver with its claims not yet prepared, records the
devices answered and checkpoints again. A driver's error for a claim is an error naming
the claim and the driver. `unprepare(pod_uid)` drops the pod from its claims; a claim
no pod uses any more is unprepared (NodeUnprepareResources per driver) and forgotten,
checkpointed after each step; one whose driver failed stays cached without pods and is
unprepared again by the next `unprepare`. `cdi_devices(pod, container)` is what the container gets
(`cdi.container_cdi_devices` over the cache).

Upstream's metrics come from here: each `prepare` and `unprepare` is timed and told to
`ManagerDeps.observe` (PrepareResources / UnprepareResources, whether it succeeded,
seconds), every call syncpod makes, as upstream's PrepareResources/UnprepareResources
observe every call the kubelet makes, a pod without claims too; `claims_in_use()` is
the count by driver of the claims whose drivers answered NodePrepareResources, plus
upstream's `<any>` for all of them (a claim of two drivers counts once for each and
once in `<any>`), which syncloop's /metrics reads at each scrape. Claims read back from
the checkpoint are not in use until prepared again, as upstream's isPrepared.

The checkpoint is read at the first call, not at construction: only syncloop's leader
runs pod workers, and a standby that takes over must start from what the old leader
wrote, not from what the file held when the standby started. As upstream, claims read
back from it are not marked prepared: a pod that was running keeps its containers and
their CDI devices come from the checkpoint (`cdi_devices`), with no driver called
(prepare runs only before a new sandbox); a new pod using one prepares it again
(drivers treat a repeated prepare as a no-op).

Every failure is a `DRAPrepareError` naming the claim, the driver or the file: a claim
the template controller has not created yet, a driver's gRPC error, a checkpoint that
cannot be written. The pod path (pods/syncpod.py) turns it into upstream's
FailedPrepareDynamicResources Event and a retried sync.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from klet.model.dra import ClaimRef, PrepareResult
from klet.syncloop.dra.cdi import (
    ClaimResolutionError,
    claim_name,
    container_cdi_devices,
    container_claim_infos,
)
from klet.syncloop.dra.claiminfo import ClaimInfo
from klet.syncloop.dra.claims import claim_to_prepare
from klet.syncloop.dra.state import DRACheckpointError


class DRAPrepareError(Exception):
    """A pod's claims could not be prepared or unprepared; says which and why."""


class ClaimSource(Protocol):
    async def resource_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class DriverClient(Protocol):
    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]: ...
    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]: ...
    async def close(self) -> None: ...


class DriverRegistry(Protocol):
    def client(self, driver: str) -> DriverClient: ...
    def current(self, driver: str) -> object | None: ...


class CheckpointStore(Protocol):
    def load(self) -> list[ClaimInfo]: ...
    def store(self, claims: Iterable[ClaimInfo]) -> None: ...


@dataclass(frozen=True)
class ManagerDeps:
    claims: ClaimSource
    drivers: DriverRegistry
    checkpoint: CheckpointStore
    observe: Callable[[str, bool, float], None] | None = None
    """Told (operation, succeeded, seconds) after each prepare and unprepare."""
    clock: Callable[[], float] = time.monotonic


ANY_DRIVER = "<any>"
"""upstream's driver_name of the count of all claims in use (DRAResourceClaimsInUseAnyDriver)."""


def _ref(info: ClaimInfo) -> ClaimRef:
    return ClaimRef(namespace=info.namespace, name=info.claim_name, uid=info.claim_uid)


class ClaimManager:
    def __init__(self, deps: ManagerDeps) -> None:
        self.deps = deps
        self.cache: dict[str, ClaimInfo] = {}
        self.prepared: set[str] = set()
        """Keys of the claims whose drivers all answered NodePrepareResources."""
        self._loaded = False

    def _load(self) -> None:
        """The checkpointed claims into the cache, once (the module docstring says why
        not at construction)."""
        if self._loaded:
            return
        try:
            checkpointed = self.deps.checkpoint.load()
        except DRACheckpointError as err:
            raise DRAPrepareError(str(err)) from err
        self.cache = {info.key: info for info in checkpointed} | self.cache
        self._loaded = True

    def _client(self, driver: str) -> DriverClient:
        try:
            return self.deps.drivers.client(driver)
        except LookupError as err:  # deregistered since the check
            raise DRAPrepareError(str(err)) from err

    def _store(self) -> None:
        try:
            self.deps.checkpoint.store(self.cache.values())
        except DRACheckpointError as err:
            raise DRAPrepareError(str(err)) from err

    async def _timed(self, operation: str, work: Awaitable[None]) -> None:
        start, succeeded = self.deps.clock(), False
        try:
            await work
            succeeded = True
        finally:
            if self.deps.observe is not None:
                self.deps.observe(operation, succeeded, self.deps.clock() - start)

    async def prepare(self, pod: Mapping[str, Any]) -> None:
        await self._timed("PrepareResources", self._prepare(pod))

    async def unprepare(self, pod_uid: str) -> None:
        await self._timed("UnprepareResources", self._unprepare(pod_uid))

    def claims_in_use(self) -> dict[str, int]:
        """Claims in use (all their drivers answered NodePrepareResources), by driver,
        and all of them under ANY_DRIVER (upstream's claimsInUse). Read from a scrape's
        thread: it copies what it reads and never loads the checkpoint."""
        counts: dict[str, int] = {ANY_DRIVER: 0}
        cache = dict(self.cache)
        for key in list(self.prepared):
            info = cache.get(key)
            if info is None:
                continue
            counts[ANY_DRIVER] += 1
            for driver in info.driver_state:
                counts[driver] = counts.get(driver, 0) + 1
        return counts

    async def _prepare(self, pod: Mapping[str, Any]) -> None:
        self._load()
        meta = pod.get("metadata") or {}
        namespace, pod_uid = str(meta.get("namespace", "")), str(meta.get("uid", ""))
        wanted: list[ClaimInfo] = []
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or ():
            try:
                name = claim_name(pod, pod_claim)
            except ClaimResolutionError as err:
                raise DRAPrepareError(str(err)) from err
            if name is None:
                continue
            try:
                claim = await self.deps.claims.resource_claim(namespace, name)
            except LookupError as err:
                raise DRAPrepareError(f"fetch ResourceClaim {name}: {err}") from err
            try:
                info = claim_to_prepare(
                    pod, from_template=bool(pod_claim.get("resourceClaimTemplateName")), claim=claim
                )
            except ValueError as err:
                raise DRAPrepareError(str(err)) from err
            for driver in info.driver_state:
                if self.deps.drivers.current(driver) is None:
                    raise DRAPrepareError(f"DRA driver {driver} is not registered")
            wanted.append(info)

        batches: dict[str, list[ClaimInfo]] = {}
        for info in wanted:
            held = self.cache.get(info.key)
            if held is not None and held.claim_uid != info.claim_uid:
                raise DRAPrepareError(
                    f"old ResourceClaim with same name {info.claim_name} and different UID "
                    f"{held.claim_uid} still exists (previous pod force-deleted?!)"
                )
            self.cache[info.key] = (held or info).with_pod(pod_uid)
            self._store()
            if info.key in self.prepared:
                continue
            for driver in info.driver_state:
                batches.setdefault(driver, []).append(info)

        answered: dict[str, set[str]] = {}
        for driver, infos in batches.items():
            client = self._client(driver)
            try:
                results = await client.prepare([_ref(i) for i in infos])
            except Exception as err:
                raise DRAPrepareError(
                    f"NodePrepareResources of DRA driver {driver} failed: {err}"
                ) from err
            finally:
                await client.close()
            for info in infos:
                result = results[info.claim_uid]
                if result.error:
                    raise DRAPrepareError(
                        f"NodePrepareResources of ResourceClaim {info.key} by DRA driver "
                        f"{driver} failed: {result.error}"
                    )
                held = self.cache[info.key]
                state = {**held.driver_state, driver: result.devices}
                self.cache[info.key] = ClaimInfo(
                    claim_uid=held.claim_uid,
                    claim_name=held.claim_name,
                    namespace=held.namespace,
                    pod_uids=held.pod_uids,
                    driver_state=state,
                )
                answered.setdefault(info.key, set()).add(driver)
        for key, drivers in answered.items():
            if drivers == set(self.cache[key].driver_state):
                self.prepared.add(key)
        if batches:
            self._store()

    def holds(self, pod_uid: str) -> bool:
        """Whether a claim the manager keeps references the pod."""
        self._load()
        return any(pod_uid in info.pod_uids for info in self.cache.values())

    async def _unprepare(self, pod_uid: str) -> None:
        self._load()
        if not self.holds(pod_uid) and all(info.pod_uids for info in self.cache.values()):
            return  # nothing of this pod's, nothing left over: no checkpoint write either
        for key, info in list(self.cache.items()):
            if pod_uid in info.pod_uids:
                self.cache[key] = info.without_pod(pod_uid)
        self._store()
        # Every claim no pod uses: this pod's, and any an earlier failure left.
        unused = [info for info in self.cache.values() if not info.pod_uids]
        batches: dict[str, list[ClaimInfo]] = {}
        for info in unused:
            for driver in info.driver_state:
                batches.setdefault(driver, []).append(info)
        failed: list[str] = []
        for driver, infos in batches.items():
            client = self._client(driver)
            try:
                errors = await client.unprepare([_ref(i) for i in infos])
            except Exception as err:
                raise DRAPrepareError(
                    f"NodeUnprepareResources of DRA driver {driver} failed: {err}"
                ) from err
            finally:
                await client.close()
            failed += [
                f"ResourceClaim {i.key} by DRA driver {driver}: {errors[i.claim_uid]}"
                for i in infos
                if errors.get(i.claim_uid)
            ]
        if failed:
            raise DRAPrepareError("NodeUnprepareResources failed: " + "; ".join(failed))
        for info in unused:
            self.cache.pop(info.key, None)
            self.prepared.discard(info.key)
        self._store()

    def container_claims(
        self, pod: Mapping[str, Any], container: Mapping[str, Any]
    ) -> list[ClaimInfo]:
        """The prepared claims the container names in `resources.claims`, in the pod's
        claim order (upstream's GetContainerClaimInfos, which the PodResources API
        lists); ClaimResolutionError naming one not prepared on this node."""
        self._load()
        return [info for _, info in container_claim_infos(pod, container, self.cache)]

    def cdi_devices(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[str, ...]:
        """The container's CDI device IDs; ClaimResolutionError (a ValueError) naming a
        claim it uses that is not prepared, DRAPrepareError for an unreadable checkpoint."""
        self._load()
        return container_cdi_devices(pod, container, self.cache)

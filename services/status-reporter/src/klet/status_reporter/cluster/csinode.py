"""The node's CSINode object and the Node's CSI annotation and topology labels.

What the CSI drivers registered on this node (syncloop's `csidrivers` bus table) must
look like in the apiserver, as upstream's node info manager writes it when a driver
registers: the CSINode named after the node (owned by the Node, so it goes with it)
lists each driver with the node ID the driver gave, its topology keys and, when the
driver has one, its volume limit (`allocatable.count`); the Node carries the driver's
node ID in the `csi.volume.kubernetes.io/nodeid` annotation (a JSON map, driver → ID)
and the driver's topology segments as labels. The scheduler and the attach-detach
controller read these.

Declarative, where upstream adds and removes entry by entry: the CSINode lists exactly
the drivers in the table, so a driver that went away while no status-reporter ran is
dropped too. Topology labels are only added (upstream leaves them when a driver goes,
and another driver may share a key); a label the Node already has with another value is
not overwritten: the driver's entry is left out and the conflict is logged, as
upstream refuses such a registration.

The manager checks the table every `interval_s` and writes only what changed since its
last write, plus a full re-check every `resync_s` (someone may have edited the
objects). Only the lease holder runs it (managers.py). `desired_*` are pure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from klet.bus import BusError
from klet.kube import Conflict, KubeError, NotFound
from klet.model.records import CSIDriverRecord
from klet.model.types import JSON
from klet.status_reporter.cluster.kubeapi import Kube
from klet.status_reporter.cluster.nodeid import NodeIdentity

log = logging.getLogger(__name__)

NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid"
CSINODES = "/apis/storage.k8s.io/v1/csinodes"


class DriverTable(Protocol):
    async def all(self) -> dict[str, CSIDriverRecord]: ...


def desired_drivers(records: Mapping[str, CSIDriverRecord]) -> list[JSON]:
    """CSINode `spec.drivers`, sorted by name."""
    out: list[JSON] = []
    for name in sorted(records):
        r = records[name]
        entry: JSON = {
            "name": r.name,
            "nodeID": r.node_id,
            "topologyKeys": sorted(str(k) for k in r.topology) or None,
        }
        if r.max_volumes > 0:
            entry["allocatable"] = {"count": r.max_volumes}
        out.append({k: v for k, v in entry.items() if v is not None})
    return out


@dataclass(frozen=True)
class NodeChange:
    """The merge patch of the Node's metadata, and the drivers left out of it."""

    patch: JSON | None
    conflicts: dict[str, str]  # driver → why


def desired_node_change(node: JSON, records: Mapping[str, CSIDriverRecord]) -> NodeChange:
    """What the Node's annotation and labels need, given what it has."""
    meta = node.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    conflicts: dict[str, str] = {}
    ids: dict[str, str] = {}
    new_labels: dict[str, str] = {}
    for name in sorted(records):
        r = records[name]
        clash: dict[str, str] = {}
        for k, v in r.topology.items():
            have = new_labels.get(k, labels.get(k))
            if have is not None and have != str(v):
                clash[k] = have
        if clash:
            conflicts[name] = "topology label(s) already set otherwise: " + ", ".join(
                f"{k}={v}" for k, v in sorted(clash.items())
            )
            continue
        ids[name] = r.node_id
        for k, v in r.topology.items():
            if labels.get(k) != str(v):
                new_labels[k] = str(v)
    current = (meta.get("annotations") or {}).get(NODE_ID_ANNOTATION)
    wanted = json.dumps(ids, sort_keys=True, separators=(",", ":")) if ids else None
    try:
        have = json.loads(current) if current else None
    except ValueError:
        have = None
    patch: JSON = {}
    if (have or None) != (ids or None):
        patch.setdefault("metadata", {})["annotations"] = {NODE_ID_ANNOTATION: wanted}
    if new_labels:
        patch.setdefault("metadata", {})["labels"] = new_labels
    return NodeChange(patch or None, conflicts)


class CSINodeManager:
    def __init__(
        self,
        kube: Kube,
        table: DriverTable,
        identity: NodeIdentity,
        *,
        interval_s: float = 2.0,
        resync_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.table = table
        self.identity = identity
        self.interval_s = interval_s
        self.resync_s = resync_s
        self.clock = clock
        self._applied: dict[str, CSIDriverRecord] | None = None
        self._applied_at = 0.0
        self._failing: str | None = None
        self._conflicts: dict[str, str] = {}

    async def sync_once(self) -> bool:
        """Bring the objects in line with the table if they may differ; whether they
        are (False: retry at the next tick)."""
        if self.identity.uid is None:
            return False
        try:
            records = await self.table.all()
        except BusError as err:
            return self._fail(f"cannot read the CSI drivers table: {err}")
        fresh = self.clock() - self._applied_at < self.resync_s
        if records == self._applied and fresh:
            return True
        try:
            accepted = await self._apply_node(records)
            await self._apply_csinode(accepted)
        except KubeError as err:
            return self._fail(f"cannot update the node's CSI objects: {err}")
        self._applied, self._applied_at = dict(records), self.clock()
        if self._failing is not None:
            log.info("node CSI objects updated again")
            self._failing = None
        return True

    def _fail(self, message: str) -> bool:
        if message != self._failing:
            log.warning(message)
            self._failing = message
        return False

    async def _apply_node(
        self, records: Mapping[str, CSIDriverRecord]
    ) -> dict[str, CSIDriverRecord]:
        node = await self.kube.get(f"/api/v1/nodes/{self.identity.name}")
        change = desired_node_change(node, records)
        for name, why in change.conflicts.items():
            if self._conflicts.get(name) != why:
                log.warning("CSI driver left out of the node", extra={"driver": name, "why": why})
        self._conflicts = dict(change.conflicts)
        if change.patch is not None:
            await self.kube.patch(f"/api/v1/nodes/{self.identity.name}", change.patch, kind="merge")
        return {k: v for k, v in records.items() if k not in change.conflicts}

    async def _apply_csinode(self, records: Mapping[str, CSIDriverRecord]) -> None:
        name = self.identity.name
        drivers = desired_drivers(records)
        try:
            current: Any = await self.kube.get(f"{CSINODES}/{name}")
        except NotFound:
            current = None
        if current is None:
            body: JSON = {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {
                    "name": name,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self.identity.uid}
                    ],
                },
                "spec": {"drivers": drivers},
            }
            try:
                await self.kube.create(CSINODES, body)
                log.info("CSINode created", extra={"drivers": [d["name"] for d in drivers]})
                return
            except Conflict:  # created meanwhile: update it below
                current = await self.kube.get(f"{CSINODES}/{name}")
        if ((current.get("spec") or {}).get("drivers") or []) == drivers:
            return
        current.setdefault("spec", {})["drivers"] = drivers
        await self.kube.replace(f"{CSINODES}/{name}", current)
        log.info("CSINode updated", extra={"drivers": [d["name"] for d in drivers]})

    async def run(self) -> None:
        await self.identity.registered.wait()
        while True:
            await self.sync_once()
            await asyncio.sleep(self.interval_s)

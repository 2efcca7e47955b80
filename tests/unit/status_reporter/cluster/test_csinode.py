"""The node's CSI objects (klet.status_reporter.cluster.csinode): CSINode drivers from the bus
table (sorted, topology keys, allocatable only with a limit); the Node's node-ID
annotation and topology labels, a clashing label leaving its driver out; the manager
creating the CSINode owned by the Node, replacing its drivers when the table changes,
emptying it when the last driver goes, writing nothing when nothing changed, retrying
an apiserver or bus outage, and waiting for the Node's UID."""

from __future__ import annotations

import json

import pytest
from klet.bus import BusUnavailable, NodeBus
from klet.model.records import CSIDriverRecord
from klet.status_reporter.cluster.csinode import (
    NODE_ID_ANNOTATION,
    CSINodeManager,
    desired_drivers,
    desired_node_change,
)
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.status_reporter import FakeApiServer

NODE = "n1"
CSINODE = f"/apis/storage.k8s.io/v1/csinodes/{NODE}"


def driver(name: str, node_id: str = "id-1", *, limit: int = 0, **topology: str) -> CSIDriverRecord:
    return CSIDriverRecord(
        name=name,
        endpoint=f"/plugins/{name}/csi.sock",
        registration=f"/reg/{name}.sock",
        node_id=node_id,
        max_volumes=limit,
        topology={k.replace("_", "/"): v for k, v in topology.items()},
        versions="1.0.0",
        registered_at=1.0,
    )


def test_desired_drivers() -> None:
    records = {
        "b.csi": driver("b.csi", "nb"),
        "a.csi": driver("a.csi", "na", limit=8, zone_a="z1", host_a="n1"),
    }
    assert desired_drivers(records) == [
        {
            "name": "a.csi",
            "nodeID": "na",
            "topologyKeys": ["host/a", "zone/a"],
            "allocatable": {"count": 8},
        },
        {"name": "b.csi", "nodeID": "nb"},
    ]


def node(labels: dict[str, str] | None = None, ids: dict[str, str] | None = None) -> dict:
    meta: dict = {"name": NODE, "labels": labels or {}}
    if ids is not None:
        meta["annotations"] = {NODE_ID_ANNOTATION: json.dumps(ids)}
    return {"metadata": meta}


def test_node_change_adds_ids_and_labels_once() -> None:
    records = {"a.csi": driver("a.csi", "na", zone_a="z1")}
    change = desired_node_change(node(), records)
    assert change.patch == {
        "metadata": {
            "annotations": {NODE_ID_ANNOTATION: '{"a.csi":"na"}'},
            "labels": {"zone/a": "z1"},
        }
    }
    assert desired_node_change(node({"zone/a": "z1"}, {"a.csi": "na"}), records).patch is None


def test_node_change_drops_the_annotation_of_the_last_driver() -> None:
    change = desired_node_change(node({"zone/a": "z1"}, {"a.csi": "na"}), {})
    assert change.patch == {"metadata": {"annotations": {NODE_ID_ANNOTATION: None}}}


def test_a_clashing_topology_label_leaves_its_driver_out() -> None:
    records = {"a.csi": driver("a.csi", zone_a="z1"), "b.csi": driver("b.csi", "nb", zone_a="z2")}
    change = desired_node_change(node(), records)
    assert set(change.conflicts) == {"b.csi"} and "zone/a=z1" in change.conflicts["b.csi"]
    assert change.patch is not None
    assert change.patch["metadata"]["annotations"] == {NODE_ID_ANNOTATION: '{"a.csi":"id-1"}'}


class World:
    def __init__(self) -> None:
        self.kube = FakeApiServer()
        self.node = self.kube.put(f"/api/v1/nodes/{NODE}", node())
        self.bus = FakeBus(NODE)
        self.table = NodeBus.of(self.bus, service="status-reporter").csidrivers
        self.identity = NodeIdentity(NODE)
        self.identity.set_uid(self.node["metadata"]["uid"])
        self.t = 0.0
        self.manager = CSINodeManager(
            self.kube, self.table, self.identity, resync_s=60.0, clock=lambda: self.t
        )

    def csinode(self) -> dict:
        obj = self.kube.get_object(CSINODE)
        assert obj is not None
        return obj


async def test_the_manager_keeps_the_csinode_in_line_with_the_table() -> None:
    w = World()
    assert await w.manager.sync_once()
    created = w.csinode()
    assert created["spec"] == {"drivers": []}
    assert created["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": w.node["metadata"]["uid"]}
    ]
    w.bus.seed(w.table, "a.csi", driver("a.csi", "na", limit=4, zone_a="z1"))
    assert await w.manager.sync_once()
    assert w.csinode()["spec"]["drivers"] == [
        {"name": "a.csi", "nodeID": "na", "topologyKeys": ["zone/a"], "allocatable": {"count": 4}}
    ]
    n = w.kube.get_object(f"/api/v1/nodes/{NODE}")
    assert n is not None
    assert n["metadata"]["annotations"][NODE_ID_ANNOTATION] == '{"a.csi":"na"}'
    assert n["metadata"]["labels"]["zone/a"] == "z1"
    writes = w.kube.count("PUT") + w.kube.count("PATCH") + w.kube.count("POST")
    assert await w.manager.sync_once()
    assert w.kube.count("PUT") + w.kube.count("PATCH") + w.kube.count("POST") == writes
    w.bus.drop(w.table, "a.csi")
    assert await w.manager.sync_once()
    assert w.csinode()["spec"]["drivers"] == []
    n = w.kube.get_object(f"/api/v1/nodes/{NODE}")
    assert n is not None and NODE_ID_ANNOTATION not in (n["metadata"].get("annotations") or {})


async def test_a_changed_object_is_put_back_at_the_resync() -> None:
    w = World()
    w.bus.seed(w.table, "a.csi", driver("a.csi", "na"))
    assert await w.manager.sync_once()
    edited = w.csinode()
    edited["spec"]["drivers"] = []
    w.kube.put(CSINODE, edited)
    assert await w.manager.sync_once()
    assert w.csinode()["spec"]["drivers"] == []  # not looked at before the resync
    w.t = 61.0
    assert await w.manager.sync_once()
    assert [d["name"] for d in w.csinode()["spec"]["drivers"]] == ["a.csi"]


@pytest.mark.parametrize("outage", ["apiserver", "bus"])
async def test_an_outage_is_retried(outage: str) -> None:
    w = World()
    w.bus.seed(w.table, "a.csi", driver("a.csi", "na"))
    if outage == "apiserver":
        w.kube.down = True
    else:
        w.bus.error = BusUnavailable("down")
    assert not await w.manager.sync_once()
    w.kube.down, w.bus.error = False, None
    assert await w.manager.sync_once()
    assert [d["name"] for d in w.csinode()["spec"]["drivers"]] == ["a.csi"]


async def test_nothing_is_written_before_the_node_is_known() -> None:
    w = World()
    w.identity.forget()
    assert not await w.manager.sync_once()
    assert w.kube.get_object(CSINODE) is None

"""The node's bus by name (klet.bus.schema): node conditions reach their readers only
as the service that wrote them owns them (issue 39 item 9). eviction may say
MemoryPressure, DiskPressure, PIDPressure and, while the node shuts down, Ready False
"node is shutting down"; syncloop only Ready. Any other row of either table (another
type, a record naming another type than its key, eviction's Ready for any other
reason) is left out and logged once while it stays."""

from __future__ import annotations

import logging

import pytest
from klet.bus import NodeBus
from klet.model.node import NODE_SHUTTING_DOWN
from klet.model.records import NodeConditionRecord
from klet.testbed.fakes.bus import FakeBus


def cond(type_: str, status: str = "True", message: str = "") -> NodeConditionRecord:
    return NodeConditionRecord(type=type_, status=status, at=1.0, message=message)


def tables(bus: FakeBus) -> tuple[NodeBus, NodeBus]:
    return NodeBus.of(bus, service="eviction"), NodeBus.of(bus, service="syncloop")


async def test_each_service_contributes_the_types_it_owns() -> None:
    bus = FakeBus()
    eviction, syncloop = tables(bus)
    shutdown = cond("Ready", "False", NODE_SHUTTING_DOWN)
    for type_ in ("MemoryPressure", "DiskPressure", "PIDPressure"):
        bus.seed(eviction.conditions, type_, cond(type_))
    bus.seed(eviction.conditions, "Ready", shutdown)
    bus.seed(syncloop.conditions, "Ready", cond("Ready", "False", "PLEG is not healthy"))
    assert await NodeBus.of(bus, service="status-reporter").node.all() == {
        "eviction:MemoryPressure": cond("MemoryPressure"),
        "eviction:DiskPressure": cond("DiskPressure"),
        "eviction:PIDPressure": cond("PIDPressure"),
        "eviction:Ready": shutdown,
        "syncloop:Ready": cond("Ready", "False", "PLEG is not healthy"),
    }


@pytest.mark.parametrize(
    ("writer", "key", "record"),
    [
        ("eviction", "Ready", cond("Ready", "False", "forged")),
        ("eviction", "Ready", cond("Ready", "True", NODE_SHUTTING_DOWN)),
        ("eviction", "NetworkUnavailable", cond("NetworkUnavailable")),
        ("eviction", "MemoryPressure", cond("Ready", "False", NODE_SHUTTING_DOWN)),
        ("syncloop", "MemoryPressure", cond("MemoryPressure")),
        ("syncloop", "Ready", cond("DiskPressure")),
        ("syncloop", "KernelDeadlock", cond("KernelDeadlock")),
    ],
)
async def test_a_condition_its_writer_does_not_own_is_left_out(
    writer: str, key: str, record: NodeConditionRecord, caplog: pytest.LogCaptureFixture
) -> None:
    bus = FakeBus()
    eviction, syncloop = tables(bus)
    bus.seed(eviction.conditions, "PIDPressure", cond("PIDPressure"))
    bus.seed({"eviction": eviction, "syncloop": syncloop}[writer].conditions, key, record)
    reader = NodeBus.of(bus, service="status-reporter").node
    with caplog.at_level(logging.ERROR, logger="klet.bus.schema"):
        assert await reader.all() == {"eviction:PIDPressure": cond("PIDPressure")}
        assert await reader.all() == {"eviction:PIDPressure": cond("PIDPressure")}
    left_out = [r for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1  # once while it stays
    assert (left_out[0].table, left_out[0].key) == (f"node:{writer}", key)  # type: ignore[attr-defined]

"""Device plugin resources on the Node (status_reporter.devices and node_status): the
bus `devices` records become capacity (all devices) and allocatable (the healthy ones),
a resource whose plugin went shows 0, and before the table was read nothing is added."""

from __future__ import annotations

from klet.model.records import DeviceResourceRecord
from klet.status_reporter.cluster.nodestatus import node_status
from klet.status_reporter.tables.devices import DeviceView

from tests.unit.status_reporter.cluster.test_nodestatus import CFG, obs


class Table:
    def __init__(self, rows: dict[str, DeviceResourceRecord]) -> None:
        self.rows = rows

    async def all(self) -> dict[str, DeviceResourceRecord]:
        return dict(self.rows)


def rec(
    resource: str, healthy: int, unhealthy: int, connected: bool = True
) -> DeviceResourceRecord:
    return DeviceResourceRecord(
        resource=resource, healthy=healthy, unhealthy=unhealthy, connected=connected, at=1.0
    )


async def test_devices_in_capacity_and_allocatable() -> None:
    view = DeviceView(
        Table(
            {
                "example.com/foo": rec("example.com/foo", 1, 1),
                "example.com/gone": rec("example.com/gone", 0, 0, False),
            }
        )
    )
    assert view.amounts() is None
    await view.refresh()
    assert view.amounts() == {"example.com/foo": (2, 1), "example.com/gone": (0, 0)}
    base = obs()
    status = node_status(
        CFG, type(base)(**{**base.__dict__, "devices": view.amounts()}), existing=None, now=1.0
    )
    assert status["capacity"]["example.com/foo"] == "2"
    assert status["allocatable"]["example.com/foo"] == "1"
    assert (status["capacity"]["example.com/gone"], status["allocatable"]["example.com/gone"]) == (
        "0",
        "0",
    )
    assert status["capacity"]["cpu"] == "2"  # the machine's own stay
    plain = node_status(CFG, base, existing=None, now=1.0)
    assert "example.com/foo" not in plain["capacity"]

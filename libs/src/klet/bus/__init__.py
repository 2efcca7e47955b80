"""Redis bus: tables, streams and leases (see redisbus.py), and the node's key names."""

from klet.bus.holder import service_lease
from klet.bus.redisbus import (
    Bus,
    BusAuth,
    BusError,
    BusUnavailable,
    Entry,
    Fenced,
    GroupStream,
    Lease,
    LeaseLapsed,
    Stream,
    Table,
    Transaction,
)
from klet.bus.schema import NodeBus

__all__ = [
    "Bus",
    "BusAuth",
    "BusError",
    "BusUnavailable",
    "Entry",
    "Fenced",
    "GroupStream",
    "Lease",
    "LeaseLapsed",
    "NodeBus",
    "Stream",
    "Table",
    "Transaction",
    "service_lease",
]

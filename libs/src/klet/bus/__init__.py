"""Redis bus: tables, streams and leases (see redisbus.py), and the node's key names."""

from klet.bus.redisbus import (
    Bus,
    BusAuth,
    BusError,
    BusUnavailable,
    Entry,
    GroupStream,
    Lease,
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
    "GroupStream",
    "Lease",
    "NodeBus",
    "Stream",
    "Table",
    "Transaction",
]

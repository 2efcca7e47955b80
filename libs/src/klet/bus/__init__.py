"""Redis bus: tables, streams and leases (see redisbus.py), and the node's key names.

The names below load their modules on first use (PEP 562): `klet.bus.acl`, the pure
ACL helpers that `klet up` and `klet bus-acl` need, must not pull in the redis client
(about 10 MB resident) through this package's import. A service that uses the bus
loads it as before, with its first `from klet.bus import ...`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klet.bus.holder import service_lease
    from klet.bus.redisbus import (
        BadWrite,
        Bus,
        BusAuth,
        BusError,
        BusUnavailable,
        Entry,
        Fenced,
        GroupStream,
        Lease,
        LeaseLapsed,
        NotOwned,
        Stream,
        Table,
        Transaction,
        WriteTooLarge,
    )
    from klet.bus.schema import NodeBus

_HOME = {
    "service_lease": "klet.bus.holder",
    "NodeBus": "klet.bus.schema",
    **{
        name: "klet.bus.redisbus"
        for name in (
            "BadWrite",
            "Bus",
            "BusAuth",
            "BusError",
            "BusUnavailable",
            "Entry",
            "Fenced",
            "GroupStream",
            "Lease",
            "LeaseLapsed",
            "NotOwned",
            "Stream",
            "Table",
            "Transaction",
            "WriteTooLarge",
        )
    },
}

__all__ = [
    "BadWrite",
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
    "NotOwned",
    "Stream",
    "Table",
    "Transaction",
    "WriteTooLarge",
    "service_lease",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'klet.bus' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value

"""CRI v1 access: the client adapter, its value types, errors and upstream labels.

The errors load with the package; `RuntimeClient`, `CRISettings` and `cri_settings` load
klet.cri.client (gRPC and the CRI stubs, about 14 MB resident) on first use (PEP 562),
so code that only catches a CRIError or reads klet.cri.types does not pay for gRPC:
a standalone status-reporter talks to no runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from klet.cri.errors import CRIError, NotFound, RuntimeUnavailable

if TYPE_CHECKING:
    from klet.cri.client import CRISettings, RuntimeClient, cri_settings

_CLIENT = ("CRISettings", "RuntimeClient", "cri_settings")

__all__ = [
    "CRIError",
    "CRISettings",
    "NotFound",
    "RuntimeClient",
    "RuntimeUnavailable",
    "cri_settings",
]


def __getattr__(name: str) -> Any:
    if name not in _CLIENT:
        raise AttributeError(f"module 'klet.cri' has no attribute {name!r}")
    value = getattr(importlib.import_module("klet.cri.client"), name)
    globals()[name] = value  # later lookups skip this function
    return value

"""CRI v1 access: the client adapter, its value types, errors and upstream labels."""

from klet.cri.client import CRISettings, RuntimeClient, cri_settings
from klet.cri.errors import CRIError, NotFound, RuntimeUnavailable

__all__ = [
    "CRIError",
    "CRISettings",
    "NotFound",
    "RuntimeClient",
    "RuntimeUnavailable",
    "cri_settings",
]

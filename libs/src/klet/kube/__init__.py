"""The apiserver adapter: `KubeClient` (raw JSON over the official client) and errors."""

from klet.kube.client import KubeClient, KubeSettings, WatchEvent, kube_settings
from klet.kube.errors import Conflict, Forbidden, Gone, Invalid, KubeError, NotFound, Unavailable

__all__ = [
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeError",
    "KubeSettings",
    "NotFound",
    "Unavailable",
    "WatchEvent",
    "kube_settings",
]

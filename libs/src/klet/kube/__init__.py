"""The apiserver adapter: settings, watch events and errors.

`KubeClient` (raw JSON over the official client) lives in klet.kube.client and is not
re-exported here: importing it loads the `kubernetes` package, which a standalone
service never needs, so a service imports it only where it builds the cluster-mode client.
"""

from klet.kube.errors import Conflict, Forbidden, Gone, Invalid, KubeError, NotFound, Unavailable
from klet.kube.settings import KubeSettings, WatchEvent, kube_settings

__all__ = [
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "KubeSettings",
    "NotFound",
    "Unavailable",
    "WatchEvent",
    "kube_settings",
]

"""CSI drivers and the kubelet plugin registration, from the node's side (klet.csi.client).

The adapter over the generated CSI and pluginregistration stubs (klet.rpc.gen): the only
module that talks gRPC to a driver. Callers get plain dataclasses and our own errors.
"""

from klet.csi.client import (
    Capability,
    CSIClient,
    CSIError,
    DriverInfo,
    DriverUnavailable,
    NodeInfo,
    PluginInfo,
    RegistrationClient,
    Volume,
    VolumeStats,
)

__all__ = [
    "CSIClient",
    "Capability",
    "CSIError",
    "DriverInfo",
    "DriverUnavailable",
    "NodeInfo",
    "PluginInfo",
    "RegistrationClient",
    "Volume",
    "VolumeStats",
]

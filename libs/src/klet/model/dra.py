"""What syncloop and a DRA driver's kubelet plugin say to each other, without the wire.

A DRA driver registers through the plugin watcher with type `DRAPlugin` and, as its
"versions", the gRPC services it serves (`v1.DRAPlugin`, `v1beta1.DRAPlugin`); the
node agent asks it to prepare the ResourceClaims a pod uses (`NodePrepareResources`)
and to unprepare them once no pod does (`NodeUnprepareResources`). A prepared claim
answers, per driver, the devices it got: the claim requests each satisfies, its pool
and name in the driver's ResourceSlices, and the CDI device IDs the container runtime
is to inject. Pure values: `klet.rpc.dra` translates them to and from protobuf,
`klet.syncloop.dra` keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

DRA_PLUGIN = "DRAPlugin"
"""pluginregistration v1's type of a DRA driver's kubelet plugin."""
SERVICE_V1 = "v1.DRAPlugin"
SERVICE_V1BETA1 = "v1beta1.DRAPlugin"
SERVICES = (SERVICE_V1, SERVICE_V1BETA1)
"""The DRAPlugin services klet calls, most recent first (upstream's
servicesSupportedByKubelet): of those a driver offers, the first is used."""


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the driver looks it up in the apiserver."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One device a driver prepared for a claim."""

    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    """The claim's requests it satisfies (none: all of them)."""
    cdi_device_ids: tuple[str, ...] = ()
    """Fully qualified CDI device IDs (`vendor.com/class=name`)."""


@dataclass(frozen=True)
class PrepareResult:
    """A driver's answer for one claim: its devices, or why it could not prepare it."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""

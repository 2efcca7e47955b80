"""A pod volume's PersistentVolumeClaim → the PersistentVolume bound to it.

Two pod volume types name a claim: `persistentVolumeClaim` (by `claimName`) and
`ephemeral`, whose claim the ephemeral-volume controller creates from the pod's template
as `<pod name>-<volume name>`, owned by the pod. The node uses the volume only when the
claim is bound and the PV's `claimRef` points back at that claim (by UID), as upstream's
desired-state populator checks; until then the pod waits, and the cause goes into its
FailedMount event. The PV's `volumeMode` says how containers use it: a `Block` volume is
a device (`volumeDevices`), a `Filesystem` one a mount (`volumeMounts`); the container
configuration refuses the other use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from klet.model.types import JSON
from klet.syncloop.environment.kubeobjects import ObjectUnavailable
from klet.syncloop.volumes.base import VolumeError


class ClaimObjects(Protocol):
    """The reads a claim needs (`ApiObjects` has them)."""

    async def get_pvc(self, namespace: str, name: str) -> JSON | None: ...

    async def get_pv(self, name: str) -> JSON | None: ...


@dataclass(frozen=True)
class Claimed:
    """A bound claim and its volume."""

    claim: JSON
    pv: JSON
    read_only: bool
    """The pod volume's `persistentVolumeClaim.readOnly`: every mount of it read-only."""
    block: bool = False
    """The PV's `volumeMode` is Block: a device for `volumeDevices`, not a mount."""

    @property
    def pv_name(self) -> str:
        return str(self.pv["metadata"]["name"])


def claim_name(volume: JSON, pod: JSON) -> str:
    """The name of the claim the pod volume uses."""
    if isinstance(volume.get("ephemeral"), dict):
        return f"{pod['metadata']['name']}-{volume.get('name')}"
    return str((volume.get("persistentVolumeClaim") or {}).get("claimName") or "")


async def resolve(volume: JSON, pod: JSON, objects: ClaimObjects) -> Claimed:
    """The bound claim of `volume`; raises `VolumeError` saying why the pod must wait."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    name = claim_name(volume, pod)
    if not name:
        raise VolumeError("the volume names no claim")
    where = f"PVC {namespace}/{name}"
    try:
        claim = await objects.get_pvc(namespace, name)
    except ObjectUnavailable as err:
        raise VolumeError(f"error processing {where}: failed to fetch PVC: {err}") from err
    if claim is None:
        raise VolumeError(f'error processing {where}: persistentvolumeclaims "{name}" not found')
    cmeta = claim.get("metadata") or {}
    if isinstance(volume.get("ephemeral"), dict) and not _owned_by(cmeta, str(meta.get("uid"))):
        raise VolumeError(
            f"error processing {where}: the PVC was not created for pod "
            f"{namespace}/{meta.get('name')} (the pod is not its owner)"
        )
    if cmeta.get("deletionTimestamp"):
        raise VolumeError(f"error processing {where}: the PVC is being deleted")
    phase = str((claim.get("status") or {}).get("phase") or "")
    pv_name = str((claim.get("spec") or {}).get("volumeName") or "")
    if phase != "Bound" or not pv_name:
        raise VolumeError(
            f"error processing {where}: the PVC is not bound "
            f"(phase {phase or 'unset'!r}, volumeName {pv_name!r})"
        )
    try:
        pv = await objects.get_pv(pv_name)
    except ObjectUnavailable as err:
        raise VolumeError(f"error processing {where}: failed to fetch PV {pv_name}: {err}") from err
    if pv is None:
        raise VolumeError(f'error processing {where}: persistentvolumes "{pv_name}" not found')
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    if not ref.get("uid"):
        raise VolumeError(f"error processing {where}: PV {pv_name} has no claimRef")
    if ref.get("uid") != cmeta.get("uid"):
        raise VolumeError(
            f"error processing {where}: PV {pv_name} is bound to claim UID {ref.get('uid')}, "
            f"not to this claim ({cmeta.get('uid')})"
        )
    mode = str((pv.get("spec") or {}).get("volumeMode") or "Filesystem")
    if mode not in ("Filesystem", "Block"):
        raise VolumeError(f"error processing {where}: PV {pv_name} has volumeMode {mode!r}")
    read_only = bool((volume.get("persistentVolumeClaim") or {}).get("readOnly"))
    return Claimed(claim=claim, pv=pv, read_only=read_only, block=mode == "Block")


def _owned_by(meta: JSON, uid: str) -> bool:
    return any(
        ref.get("uid") == uid and ref.get("controller") for ref in meta.get("ownerReferences") or []
    )

"""`cgroupDriver: systemd`: pod and QoS cgroups as transient systemd slices.

The pod's cgroupfs name (`/kubepods/burstable/pod<uid>`) becomes the slice
`kubepods-burstable-pod<uid_>.slice` (klet.cgroups.slices), and CRI gets its full path
`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` as the
cgroup parent, so a runtime with `SystemdCgroup = true` places each container in a
`.scope` under it. Before a pod's slice, the node's slices above it (`kubepods.slice`,
`kubepods-burstable.slice`, `kubepods-besteffort.slice`) are started once, as upstream's
QoS container manager creates them at start; a restarted systemd forgets transient
units, so they are ensured again whenever systemd reports one missing. A `cgroupRoot`
other than `/` prefixes the names as upstream does: `/n1/kubepods` is the slice
`n1-kubepods.slice` at `/n1.slice/n1-kubepods.slice`.

A pod's slice is stopped when the pod is removed: systemd removes its cgroups and the
transient unit. Stopping a slice stops whatever still runs in it, which is why it only
happens after every container and the sandbox are gone (syncpod's removal path).

Huge pages: systemd has no hugetlb property, so on cgroup v1, where the host has hugetlb,
the pod's limits are written in the hugetlb hierarchy at the slice's path (under PID 1's
hugetlb cgroup, where runc puts the containers' scopes), as upstream's systemd cgroup
manager writes the controllers systemd does not manage; that directory is removed with
the slice, which systemd would not do. On v2 only the containers' limits are set.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

from klet.cgroups import SystemdError, SystemdUnavailable
from klet.cgroups.fs import pid1_cgroup_prefix
from klet.cgroups.slices import (
    Property,
    SliceLimits,
    limit_properties,
    parts_of,
    slice_properties,
    unit_name,
)
from klet.cgroups.slices import cgroup_path as slice_path
from klet.model.layout import kubepods, node_cgroups
from klet.syncloop.containers.podcgroups import NodeCgroupLimits, ensure_cgroup, hugetlb_v1
from klet.syncloop.model.resources import MIN_SHARES, PodResources

log = logging.getLogger(__name__)


def pod_slice_limits(res: PodResources) -> SliceLimits:
    return SliceLimits(
        cpu_shares=res.cpu_shares,
        cpu_quota_us=res.cpu_quota,
        cpu_period_us=res.cpu_period,
        memory_limit_bytes=res.memory_limit_bytes,
        pids_limit=res.pids_limit,
    )


class Slices(Protocol):
    """What this driver needs of systemd (klet.cgroups.systemd.Systemd;
    klet.testbed.fakes.cgroups.FakeSystemd in unit tests)."""

    async def ensure_slice(
        self, unit: str, properties: list[Property], limits: list[Property]
    ) -> bool: ...

    async def stop_slice(self, unit: str) -> None: ...

    async def unit_active_state(self, unit: str) -> str: ...


class SystemdPodCgroups:
    """Pod slices through systemd's D-Bus API (klet.cgroups.systemd)."""

    def __init__(
        self,
        systemd: Slices,
        *,
        cgroup_version: int,
        cgroup_root: str = "/",
        node: NodeCgroupLimits | None = None,
        cgroup_fs: Path = Path("/sys/fs/cgroup"),
        proc: Path = Path("/proc"),
    ) -> None:
        self.systemd = systemd
        self.cgroup_version = cgroup_version
        self.cgroup_root = cgroup_root
        self.node = node
        self.cgroup_fs = cgroup_fs
        self.proc = proc
        self._kubepods_unit = unit_name(parts_of(kubepods(cgroup_root)))
        self._node_slices_ready = False
        self._node_slices_lock = asyncio.Lock()  # pod workers start pods concurrently

    def cri_parent(self, name: str) -> str:
        return slice_path(name)

    async def _ensure_node_slices(self) -> None:
        async with self._node_slices_lock:
            if self._node_slices_ready:
                return
            kubepods, burstable, besteffort = node_cgroups(self.cgroup_root)
            node = self.node
            limits = {
                kubepods: SliceLimits()
                if node is None
                else SliceLimits(
                    cpu_shares=node.cpu_shares,
                    memory_limit_bytes=node.memory_bytes,
                    pids_limit=node.pids,
                ),
                burstable: SliceLimits(),
                besteffort: SliceLimits() if node is None else SliceLimits(cpu_shares=MIN_SHARES),
            }
            for name, limit in limits.items():
                unit = unit_name(parts_of(name))
                v = self.cgroup_version
                await self.systemd.ensure_slice(
                    unit,
                    slice_properties(unit, limit, cgroup_version=v),
                    limit_properties(limit, cgroup_version=v),
                )
            self._node_slices_ready = True

    async def _node_slices(self) -> None:
        """The node's slices, started again when systemd has forgotten them. Always
        before any slice under them: starting `kubepods-burstable.slice` first would make
        systemd load its parent `kubepods.slice` itself, as a plain (not transient) unit
        without klet's limits."""
        if self._node_slices_ready and not await self.systemd.unit_active_state(
            self._kubepods_unit
        ):
            self._node_slices_ready = False  # systemd restarted and forgot them
        await self._ensure_node_slices()

    async def update_qos(self, burstable_shares: int) -> list[str]:
        _, burstable, _ = node_cgroups(self.cgroup_root)
        unit = unit_name(parts_of(burstable))
        limits = SliceLimits(cpu_shares=burstable_shares)
        v = self.cgroup_version
        try:
            await self._node_slices()
            await self.systemd.ensure_slice(
                unit,
                slice_properties(unit, limits, cgroup_version=v),
                limit_properties(limits, cgroup_version=v),
            )
        except (SystemdError, SystemdUnavailable) as err:
            return [f"{unit}: {err}"]
        return []

    async def ensure(self, name: str, res: PodResources) -> tuple[bool, list[str]]:
        unit = unit_name(parts_of(name))
        limits = pod_slice_limits(res)
        try:
            await self._node_slices()
            existed = await self.systemd.ensure_slice(
                unit,
                slice_properties(unit, limits, cgroup_version=self.cgroup_version),
                limit_properties(limits, cgroup_version=self.cgroup_version),
            )
        except (SystemdError, SystemdUnavailable) as err:
            return False, [f"{unit}: {err}"]
        return existed, self._hugetlb(name, res)

    def _hugetlb_path(self, name: str) -> str:
        prefix = pid1_cgroup_prefix(self.proc, "hugetlb").rstrip("/")
        return prefix + slice_path(name)

    def _hugetlb(self, name: str, res: PodResources) -> list[str]:
        """The pod's hugetlb limits at its slice's path (see the module docstring)."""
        if self.cgroup_version != 1 or not res.hugepage_limits:
            return []
        return ensure_cgroup(
            self._hugetlb_path(name),
            {"hugetlb": hugetlb_v1(res.hugepage_limits)},
            {},
            root=self.cgroup_fs,
            controllers=("hugetlb",),
        )

    async def remove(self, name: str) -> list[str]:
        unit = unit_name(parts_of(name))
        try:
            await self.systemd.stop_slice(unit)
        except (SystemdError, SystemdUnavailable) as err:
            return [f"{unit}: {err}"]
        if self.cgroup_version == 1:
            hugetlb = self.cgroup_fs / "hugetlb" / self._hugetlb_path(name).lstrip("/")
            try:
                hugetlb.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                return [f"{hugetlb}: {err.strerror or err}"]
        return []

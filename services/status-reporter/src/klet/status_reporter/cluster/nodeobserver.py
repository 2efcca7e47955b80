"""Gathers what the node status is computed from: the machine, the CRI runtime and the
condition contributions other services wrote to the bus's `node` table.

An adapter: it calls the CRI (version, status, image list; each bounded by `timeout_s`
so a hung runtime delays one status update by seconds, not by runtimeRequestTimeout),
reads the `node` table and the host files (`hostinfo.read_machine`), and hands
`nodestatus.Observations` to the pure functions. Failures become observations, never
exceptions: an unreachable runtime is `reachable=False` (the node turns NotReady with
"container runtime is down", as upstream); an unreachable bus keeps the last
contributions (a Redis outage must not flip conditions). Each is logged once per
outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from klet.bus import BusError
from klet.cri import CRIError
from klet.cri.types import ImageInfo, RuntimeCondition, RuntimeVersion
from klet.model.records import NodeConditionRecord
from klet.obs import OnceLogger
from klet.status_reporter.cluster.capacity import MachineInfo
from klet.status_reporter.cluster.nodestatus import Image, Observations, RuntimeState

log = logging.getLogger(__name__)


class RuntimeService(Protocol):
    """The part of klet.cri.RuntimeClient the node status reads."""

    async def version(self) -> RuntimeVersion: ...

    async def status(self) -> list[RuntimeCondition]: ...

    async def list_images(self) -> list[ImageInfo]: ...


class ConditionTable(Protocol):
    """The bus's `node` table."""

    async def all(self) -> dict[str, NodeConditionRecord]: ...


def image_of(info: ImageInfo) -> Image:
    return Image(names=(*info.repo_digests, *info.repo_tags), size=info.size)


class NodeObserver:
    """One `observe()` per node status update."""

    def __init__(
        self,
        *,
        runtime: RuntimeService,
        conditions: ConditionTable,
        read_machine: Callable[[], MachineInfo],
        node_ips: tuple[str, ...],
        timeout_s: float = 5.0,
        volumes_in_use: Callable[[], tuple[str, ...] | None] = lambda: None,
        devices: Callable[[], Mapping[str, tuple[int, int]] | None] = lambda: None,
    ) -> None:
        self._volumes_in_use = volumes_in_use
        self._devices = devices
        self._runtime = runtime
        self._conditions = conditions
        self._read_machine = read_machine
        self.node_ips = node_ips
        self._timeout_s = timeout_s
        self._version = ""
        self._contributions: dict[str, NodeConditionRecord] = {}
        self._once = OnceLogger(log, level=logging.WARNING)

    async def observe(self) -> Observations:
        return Observations(
            machine=self._read_machine(),
            node_ips=self.node_ips,
            runtime=await self.runtime_state(),
            contributions=await self.contributions(),
            volumes_in_use=self._volumes_in_use(),
            devices=self._devices(),
        )

    async def runtime_state(self) -> RuntimeState:
        try:
            async with asyncio.timeout(self._timeout_s):
                conditions = await self._runtime.status()
        except (CRIError, TimeoutError) as err:
            self._once.error("runtime", "container runtime is down", error=str(err) or "timeout")
            return RuntimeState(reachable=False, version=self._version)
        self._once.clear("runtime", "container runtime answers again")
        images: tuple[Image, ...] | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                v = await self._runtime.version()
            self._version = f"{v.runtime_name}://{v.runtime_version}"
            async with asyncio.timeout(self._timeout_s):
                listed = await self._runtime.list_images()
            images = tuple(image_of(i) for i in listed)
        except (CRIError, TimeoutError) as err:
            # Status answered, so the runtime is up; the last version and images stand.
            log.debug("runtime version or image list failed", extra={"error": str(err)})
        return RuntimeState(
            reachable=True,
            conditions={c.type: (c.status, c.reason, c.message) for c in conditions},
            version=self._version,
            images=images,
        )

    async def contributions(self) -> dict[str, NodeConditionRecord]:
        try:
            self._contributions = await self._conditions.all()
        except BusError as err:
            self._once.error(
                "bus", "cannot read node conditions, keeping the last ones", error=str(err)
            )
        else:
            self._once.clear("bus", "node conditions readable again")
        return dict(self._contributions)

"""The node's ResourceSlices of DRA drivers that are not there (upstream's DRA plugin
manager, pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go v1.34: wipeResourceSlices).

A driver's kubelet plugin publishes ResourceSlices of the node's devices; the scheduler
allocates from them. When the driver is gone its devices cannot be prepared, and a pod
the scheduler puts on them waits on the node for good, so upstream's kubelet deletes
the node's slices of a driver whose last registered instance went away, `WIPE_DELAY_S`
(upstream's defaultWipingDelay, 30 s) later, unless it registers again in between (a
rolling update's new pod, a restart); and when it starts, before any driver has
registered again, all of the node's slices, since none is usable until its driver is
back (which republishes them). klet does both from syncloop's leader, which holds the
registrations: the `dra-slices` root task wipes every slice of the node when it starts
leading and then each driver that `changed(driver, registered=False)` reported and
that stayed away. A failed deletion (the apiserver down, the node's credentials not
ready) is tried again after a back-off (1 s, doubled, at most 5 min, as upstream's
retry), never given up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

WIPE_DELAY_S = 30.0
"""How long a driver may stay away before its slices go (upstream's defaultWipingDelay)."""
RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 300.0
ALL_DRIVERS = ""
"""The key of the start-up wipe: every driver's slices of the node."""


class SliceApi(Protocol):
    async def delete_slices(self, node: str, driver: str) -> None:
        """Delete the node's ResourceSlices (of `driver`, every driver's for ""); raises
        (any Exception) when the apiserver did not."""
        ...


class SliceWiper:
    def __init__(
        self,
        api: SliceApi,
        *,
        node: str,
        delay_s: float = WIPE_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.node = node
        self.delay_s = delay_s
        self.clock = clock
        self.pending: dict[str, float] = {}
        """Driver ("" for all) → when (clock) its slices are to be deleted."""
        self._retries: dict[str, float] = {}
        self._wake = asyncio.Event()

    def changed(self, driver: str, *, registered: bool) -> None:
        """A driver's first instance registered (its wipe, if pending, is off) or its last
        went (its wipe is due `delay_s` from now)."""
        if registered:
            if self.pending.pop(driver, None) is not None:
                log.info("DRA driver back: its ResourceSlices stay", extra={"driver": driver})
            self._retries.pop(driver, None)
        else:
            self.pending[driver] = self.clock() + self.delay_s
        self._wake.set()

    def due(self, now: float) -> list[str]:
        """The wipes whose time has come, all drivers' first."""
        return sorted(d for d, at in self.pending.items() if at <= now)

    async def run_once(self) -> float | None:
        """Do the wipes that are due; how long until the next one (None: none pending)."""
        for driver in self.due(self.clock()):
            try:
                await self.api.delete_slices(self.node, driver)
            except Exception as err:  # noqa: BLE001 - upstream retries every error
                delay = min(RETRY_MAX_S, self._retries.get(driver, RETRY_INITIAL_S / 2) * 2)
                self._retries[driver] = delay
                self.pending[driver] = self.clock() + delay
                log.warning(
                    "ResourceSlices not deleted, will retry",
                    extra={"driver": driver or "*", "retry_s": delay, "error": str(err)},
                )
                continue
            self.pending.pop(driver, None)
            self._retries.pop(driver, None)
            log.info(
                "ResourceSlices of the node deleted",
                extra={"node": self.node, "driver": driver or "*"},
            )
        if not self.pending:
            return None
        return max(0.0, min(self.pending.values()) - self.clock())

    async def run(self) -> None:
        """The leader's root task: every slice of the node at once, then each driver
        that stays away."""
        self.pending[ALL_DRIVERS] = self.clock()
        while True:
            self._wake.clear()
            wait = await self.run_once()
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            except TimeoutError:
                pass

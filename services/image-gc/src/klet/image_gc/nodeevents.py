"""Node events of the GC service (FreeDiskSpaceFailed, ImageGCFailed, ContainerGCFailed,
InvalidDiskCapacity) onto the bus's `events` stream; status-reporter posts them.

`emit` only queues, so a GC pass never waits on Redis; the `run` root task publishes
in order and, while Redis is away, retries every second (a full queue drops the oldest,
counted in `dropped`). The involved object is the Node, referenced as upstream's
kubelet does (the node name as its UID).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from klet.bus import BusError, NodeBus
from klet.model.records import EventRecord

log = logging.getLogger(__name__)


class NodeEvents:
    def __init__(
        self,
        bus: NodeBus,
        node_name: str,
        *,
        cap: int = 100,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.node_name = node_name
        self.clock = clock
        self.queue: deque[EventRecord] = deque(maxlen=cap)
        self.dropped = 0
        self._wake = asyncio.Event()

    def emit(self, type_: str, reason: str, message: str) -> None:
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1
        self.queue.append(
            EventRecord(
                type=type_,
                reason=reason,
                message=message,
                involved={"kind": "Node", "name": self.node_name, "uid": self.node_name},
                component="kubelet",
                at=self.clock(),
            )
        )
        self._wake.set()

    async def run(self) -> None:
        down = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.queue:
                try:
                    await self.bus.events.publish(self.queue[0])
                except BusError as err:
                    if not down:
                        log.warning("cannot publish events, will retry", extra={"error": str(err)})
                        down = True
                    await asyncio.sleep(1.0)
                    continue
                down = False
                self.queue.popleft()

"""Watches a Node's Ready condition from the apiserver while a test disrupts its agent.

`NodeWatch.thread` polls `GET /api/v1/nodes/<node>` as admin every half second from the
first Ready on; whatever it saw besides Ready=True afterwards is in `flaps`, with the
time. A test asserts `flaps` is empty after each disruption: "the Node never left
Ready", rather than "it was Ready whenever the test happened to look".
"""

from __future__ import annotations

import json
import threading
import time

from klet.testbed.cluster import ControlPlane


class NodeWatch:
    """Polls the Node's Ready condition from the apiserver every half second, in a
    thread, from the first Ready on: what it saw besides True is a flap."""

    def __init__(self, plane: ControlPlane, node: str) -> None:
        self.plane = plane
        self.node = node
        self.flaps: list[str] = []
        self.ready_seen = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="node-watch", daemon=True)

    def ready(self) -> str | None:
        try:
            node = json.loads(self.plane.get(f"/api/v1/nodes/{self.node}", timeout_s=5))
        except OSError:
            return None  # not registered yet, or the apiserver did not answer
        conditions = node.get("status", {}).get("conditions", [])
        found = next((c for c in conditions if c["type"] == "Ready"), None)
        return None if found is None else f"{found['status']} ({found.get('reason', '')})"

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            seen = self.ready()
            if seen is None:
                continue
            if seen.startswith("True"):
                self.ready_seen = True
            elif self.ready_seen:
                self.flaps.append(f"{time.strftime('%H:%M:%S')} Ready={seen}")

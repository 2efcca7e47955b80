"""upstream's node start-up gauges (pkg/kubelet/util's node start-up latency tracker),
set once per process as the node first registers and first reports Ready:

- `kubelet_node_startup_pre_kubelet_duration_seconds`: machine boot to this service's
  start (klet's "kubelet start": status-reporter is the service that registers the
  node, started by `klet up` or its unit with the others);
- `kubelet_node_startup_pre_registration_duration_seconds`: the start to the first
  registration attempt;
- `kubelet_node_startup_registration_duration_seconds`: that attempt to the Node's
  creation;
- `kubelet_node_startup_post_registration_duration_seconds`: the creation to the first
  status update the apiserver took with Ready True;
- `kubelet_node_startup_duration_seconds`: boot to that Ready.

As upstream's, only a node this process created sets them: adopting an existing Node
(a restart) leaves all five at 0, and so does a node that never registers (standalone).
The boot time is /proc/stat's `btime` (`boot_time`); without it the two gauges from
boot stay 0, as upstream's without a boot time.
"""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

PREFIX = "kubelet_node_startup"


def boot_time(proc_stat: str) -> float | None:
    """The `btime` of /proc/stat's text (seconds since the epoch), or None."""
    for line in proc_stat.splitlines():
        name, _, value = line.partition(" ")
        if name == "btime" and value.strip().isdigit():
            return float(value.strip())
    return None


def read_boot_time(path: Path = Path("/proc/stat")) -> float | None:
    """The machine's boot time, None when /proc/stat cannot be read."""
    try:
        return boot_time(path.read_text())
    except OSError:
        return None


class NodeStartup:
    """The tracker: `attempt`, `registered_new` and `ready` at wall-clock `now`."""

    def __init__(
        self, registry: CollectorRegistry, *, started_at: float, boot_at: float | None
    ) -> None:
        self.started_at, self.boot_at = started_at, boot_at
        self._attempt: float | None = None
        self._registered: float | None = None
        self._ready: float | None = None

        def gauge(part: str, doc: str) -> Gauge:
            name = f"{PREFIX}_{part}duration_seconds"
            return Gauge(name, doc, registry=registry)

        self.pre_kubelet = gauge(
            "pre_kubelet_", "Duration in seconds of node startup before kubelet starts."
        )
        self.pre_registration = gauge(
            "pre_registration_", "Duration in seconds of node startup before registration."
        )
        self.registration = gauge(
            "registration_", "Duration in seconds of node startup during registration."
        )
        self.post_registration = gauge(
            "post_registration_", "Duration in seconds of node startup after registration."
        )
        self.total = gauge("", "Duration in seconds of node startup in total.")

    def attempt(self, now: float) -> None:
        """A registration attempt begins (only the first counts)."""
        if self._attempt is None:
            self._attempt = now

    def registered_new(self, now: float) -> None:
        """The Node was created (not adopted); only the first counts."""
        if self._attempt is None or self._registered is not None:
            return
        self._registered = now
        if self.boot_at is not None:
            self.pre_kubelet.set(self.started_at - self.boot_at)
        self.pre_registration.set(self._attempt - self.started_at)
        self.registration.set(now - self._attempt)

    def ready(self, now: float) -> None:
        """The apiserver took a status with Ready True; only the first after the
        creation counts."""
        if self._registered is None or self._ready is not None:
            return
        self._ready = now
        self.post_registration.set(now - self._registered)
        if self.boot_at is not None:
            self.total.set(now - self.boot_at)


def node_startup(registry: CollectorRegistry, *, boot_at: float | None) -> NodeStartup:
    """The tracker of a service starting now."""
    return NodeStartup(registry, started_at=time.time(), boot_at=boot_at)

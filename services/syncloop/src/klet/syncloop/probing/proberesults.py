"""What the pure decisions need to know about probe results, as a consumer-side view.

computePodActions (liveness and startup failures, sidecar start-up gating) and the pod
status (readiness, `started`) read the latest result of each probe of a container
instance. The prober keeps the results; these functions only see this view, so they
stay pure and their tests pass plain dictionaries.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from klet.model.types import ContainerID


class ProbeKind(Enum):
    LIVENESS = "Liveness"
    READINESS = "Readiness"
    STARTUP = "Startup"


class ProbeResults(Protocol):
    def result(self, kind: ProbeKind, container_id: ContainerID) -> bool | None:
        """The latest result: True success, False failure, None not probed yet."""
        ...


class NoProbeResults:
    """No prober: nothing has been probed."""

    def result(self, kind: ProbeKind, container_id: ContainerID) -> bool | None:
        return None


class StaticProbeResults:
    """Fixed results, for tests and for replaying a snapshot."""

    def __init__(self, results: dict[tuple[ProbeKind, str], bool] | None = None) -> None:
        self.results = dict(results or {})

    def result(self, kind: ProbeKind, container_id: ContainerID) -> bool | None:
        return self.results.get((kind, container_id))


NO_PROBES = NoProbeResults()

"""The Eviction API's backend: `klet evict --dry-run` answered by the running manager.

Threshold expressions ("memory.available<2Gi") are parsed as evictionHard is
(`thresholds.parse_expressions`); a bad one is refused naming `--signal` and the
signal, with nothing measured. The decision itself is `EvictionManager.dry_run`: the
manager's own functions on a fresh measurement, nothing acted on.
"""

from __future__ import annotations

from collections.abc import Sequence

from klet.config.errors import ConfigError
from klet.config.kubelet import KubeletConfiguration
from klet.eviction.manager import EvictionManager
from klet.eviction.thresholds import parse_expressions
from klet.rpc.eviction import DryRunResult, InvalidRequest


class DryRunBackend:
    """`dry_run(expressions)` for `klet.rpc.eviction.serve_eviction`."""

    def __init__(self, manager: EvictionManager, kubelet: KubeletConfiguration) -> None:
        self.manager = manager
        self.kubelet = kubelet

    async def dry_run(self, thresholds: Sequence[str]) -> DryRunResult:
        if not thresholds:
            return await self.manager.dry_run()
        try:
            parsed = parse_expressions(thresholds, self.kubelet)
        except ConfigError as err:
            raise InvalidRequest("; ".join(err.problems)) from err
        return await self.manager.dry_run(parsed)

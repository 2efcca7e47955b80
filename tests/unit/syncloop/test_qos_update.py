"""The burstable QoS cgroup is sized once per change, not once per pod sync: 110 pods
re-adopted after a restart are 110 syncs with one size (each application reads the
node's cgroup files). It is applied again when the size changes, after QOS_RECHECK_S,
and after an application that met problems."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from klet.syncloop.pods.syncpod import QOS_RECHECK_S
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import wire


class CountingCgroups:
    def __init__(self) -> None:
        self.applied: list[int] = []
        self.problems: list[str] = []

    async def update_qos(self, burstable_shares: int) -> list[str]:
        self.applied.append(burstable_shares)
        return list(self.problems)


def burstable(cpu: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": cpu}}}]}}


async def test_the_same_size_is_applied_once_until_it_changes_or_is_due(tmp_path: Path) -> None:
    now = [1000.0]
    syncer = wire(tmp_path, FakeRuntimeService()).controller.syncer
    cgroups = CountingCgroups()
    syncer.cgroups = cgroups  # type: ignore[assignment]
    syncer.settings = dataclasses.replace(syncer.settings, cgroups_per_qos=True)
    syncer.clock = lambda: now[0]
    pods = [burstable("100m")]
    for _ in range(110):
        await syncer.update_qos(pods)
    assert len(cgroups.applied) == 1
    await syncer.update_qos([*pods, burstable("200m")])  # a new size: applied
    assert len(cgroups.applied) == 2 and cgroups.applied[1] > cgroups.applied[0]
    now[0] += QOS_RECHECK_S
    await syncer.update_qos([*pods, burstable("200m")])  # due again
    assert len(cgroups.applied) == 3
    cgroups.problems = ["EROFS"]
    await syncer.update_qos(pods)
    await syncer.update_qos(pods)  # the failed one is tried again at once
    assert len(cgroups.applied) == 5

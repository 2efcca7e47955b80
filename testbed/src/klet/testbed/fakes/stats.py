"""Fakes of the stats provider's readers, for unit tests of the provider and its
consumers; mypy checks them against the protocols at the bottom.

- `FakeCgroups` answers `stats` from a table of CgroupStats by relative path (a path in
  the table exists), `task_count` from a table of task counts, `detail` from a table
  of CgroupDetail, `procs` from a table of pid lists (a cgroup's and its children's)
  and `children` from the paths in `groups`. Tests of the real reader use a tmp_path
  cgroup tree.
- `FakeStatsRuntime` answers the provider's CRI reads from lists a test edits, counts
  the calls, and fails every call with `error` when it is set.
"""

from __future__ import annotations

from klet.cgroups import CgroupStats
from klet.cgroups.detail import CgroupDetail
from klet.cri.types import Container, ContainerStatsInfo, FilesystemUsageInfo, Sandbox
from klet.model.types import SandboxID
from klet.stats.host import CgroupReader
from klet.stats.provider import StatsRuntime


class FakeCgroups:
    def __init__(self) -> None:
        self.groups: dict[str, CgroupStats] = {}
        self.tasks: dict[str, int] = {}
        self.details: dict[str, CgroupDetail] = {}
        self.pids: dict[str, list[int]] = {}

    def stats(self, rel: str) -> CgroupStats:
        return self.groups.get(rel, CgroupStats(None, None, None, None))

    def exists(self, rel: str) -> bool:
        return rel in self.groups

    def task_count(self, rel: str) -> int:
        return self.tasks.get(rel, 0)

    def detail(self, rel: str) -> CgroupDetail:
        return self.details.get(rel, CgroupDetail())

    def children(self, rel: str) -> list[str]:
        prefix = rel.rstrip("/") + "/"
        names = {p[len(prefix) :].split("/")[0] for p in self.groups if p.startswith(prefix)}
        return sorted(names)

    def procs(self, rel: str) -> list[int]:
        prefix = rel.rstrip("/") + "/"
        return [
            pid for p, pids in self.pids.items() if p == rel or p.startswith(prefix) for pid in pids
        ]


class FakeStatsRuntime:
    def __init__(self) -> None:
        self.sandboxes: list[Sandbox] = []
        self.containers: list[Container] = []
        self.stats: list[ContainerStatsInfo] = []
        self.image_fs: list[FilesystemUsageInfo] = []
        self.container_fs: list[FilesystemUsageInfo] = []
        self.error: Exception | None = None
        self.calls = 0

    def _call(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error

    async def list_pod_sandboxes(
        self, *, label_selector: dict[str, str] | None = None
    ) -> list[Sandbox]:
        self._call()
        return list(self.sandboxes)

    async def list_containers(
        self, *, sandbox_id: SandboxID | None = None, label_selector: dict[str, str] | None = None
    ) -> list[Container]:
        self._call()
        return list(self.containers)

    async def list_container_stats(self) -> list[ContainerStatsInfo]:
        self._call()
        return list(self.stats)

    async def image_fs_info(
        self,
    ) -> tuple[list[FilesystemUsageInfo], list[FilesystemUsageInfo]]:
        self._call()
        return list(self.image_fs), list(self.container_fs)


def _conforms(c: FakeCgroups, r: FakeStatsRuntime) -> tuple[CgroupReader, StatsRuntime]:
    return c, r

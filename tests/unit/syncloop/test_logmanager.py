"""Container log rotation against the fake runtime and real files: a big log of a
running container is renamed and reopened, older rotated files are gzipped and the
oldest removed; stopped containers, small logs and logs outside podLogsDir are left
alone; a failed reopen renames the log back; a missing log is reopened; errors are
logged once per distinct error; the number of concurrent rotations is
containerLogMaxWorkers. What a round costs the runtime (issue 42): no list call (the
running containers are PLEG's), one ContainerStatus per container in its life, so an
idle round makes no CRI call; and no per-container filesystem call either: every known
log is sized in one worker-thread call and no directory is listed for a log below its
max size."""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from klet.config.kubelet import KubeletConfiguration
from klet.cri.errors import CRIError
from klet.cri.types import ContainerConfig, ContainerState, SandboxConfig
from klet.model.types import ContainerID
from klet.syncloop.containers import logmanager
from klet.syncloop.containers.logmanager import ContainerLogManager, LogManagerSettings
from klet.syncloop.containers.logrotation import RotationPolicy
from klet.testbed.fakes.cri import FakeRuntimeService

UID = "0b7e0c52-0000-4000-8000-000000000001"


class World:
    def __init__(self, tmp_path: Path, *, max_files: int = 3, workers: int = 1) -> None:
        self.logs_dir = tmp_path / "pods"
        self.cri = FakeRuntimeService()
        self.cri.add_image("busybox")
        self.now = datetime(2026, 11, 25, 7, 0, 0, tzinfo=UTC)
        self.manager = ContainerLogManager(
            self.cri,
            self.running,
            LogManagerSettings(
                policy=RotationPolicy(max_size=1000, max_files=max_files),
                logs_dir=self.logs_dir,
                workers=workers,
            ),
            clock=lambda: self.now,
        )

    def running(self) -> list[ContainerID]:
        """What PLEG's view holds: the fake runtime's running containers, read without
        a CRI call."""
        return [c.id for c in self.cri.containers.values() if c.state is ContainerState.RUNNING]

    async def container(
        self, name: str, *, log_dir: Path | None = None
    ) -> tuple[ContainerID, Path]:
        directory = log_dir or self.logs_dir / f"default_web_{UID}"
        sandbox_config = SandboxConfig(
            name=f"web-{name}",
            namespace="default",
            uid=UID,
            attempt=0,
            hostname="web",
            log_directory=str(directory),
        )
        sandbox = await self.cri.run_pod_sandbox(sandbox_config)
        cid = await self.cri.create_container(
            sandbox,
            ContainerConfig(name=name, attempt=0, image="busybox", log_path=f"{name}/0.log"),
            sandbox_config,
        )
        await self.cri.start_container(cid)
        log = directory / name / "0.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"")
        return cid, log

    def reopen_creates(self, *logs: Path) -> None:
        """The runtime's ReopenContainerLog: a new empty file at the log path."""

        async def reopen() -> None:
            for log in logs:
                if not log.exists():
                    log.write_bytes(b"")

        self.cri.hooks["ReopenContainerLog"] = reopen


def write(log: Path, text: str, size: int = 1000) -> None:
    log.write_bytes(text.encode() * (size // len(text) + 1))


def files(log: Path) -> list[str]:
    return sorted(p.name for p in log.parent.iterdir())


async def test_rotates_compresses_and_removes_as_upstream(tmp_path: Path) -> None:
    w = World(tmp_path)
    cid, log = await w.container("app")
    w.reopen_creates(log)
    write(log, "small", 500)
    assert await w.manager.run_once() == 0
    assert files(log) == ["0.log"]

    write(log, "first")
    assert await w.manager.run_once() == 1
    assert files(log) == ["0.log", "0.log.20261125-070000"]
    assert log.stat().st_size == 0 and w.cri.containers[cid].log_reopens == 1

    w.now += timedelta(seconds=10)
    write(log, "second")
    assert await w.manager.run_once() == 1
    assert files(log) == ["0.log", "0.log.20261125-070000.gz", "0.log.20261125-070010"]
    gz = log.parent / "0.log.20261125-070000.gz"
    assert gzip.decompress(gz.read_bytes()).startswith(b"firstfirst")

    w.now += timedelta(seconds=10)
    write(log, "third")
    assert await w.manager.run_once() == 1
    # maxFiles 3: the current log and two rotated ones, the older gzipped
    assert files(log) == ["0.log", "0.log.20261125-070010.gz", "0.log.20261125-070020"]
    assert (log.parent / "0.log.20261125-070020").read_bytes().startswith(b"thirdthird")


async def test_leaves_alone_what_is_not_a_running_container_of_this_node(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    stopped, stopped_log = await w.container("stopped")
    foreign, foreign_log = await w.container("foreign", log_dir=tmp_path / "elsewhere")
    await w.cri.stop_container(stopped, timeout_s=0)
    write(stopped_log, "x")
    write(foreign_log, "x")
    assert await w.manager.run_once() == 0
    assert files(stopped_log) == ["0.log"] and files(foreign_log) == ["0.log"]
    assert w.cri.calls_of("ReopenContainerLog") == []


async def test_a_failed_reopen_renames_the_log_back_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = World(tmp_path)
    cid, log = await w.container("app")
    write(log, "keep")
    w.cri.fail_always("ReopenContainerLog", CRIError("runtime says no"))
    with caplog.at_level(logging.WARNING, logger="klet.syncloop.containers.logmanager"):
        for _ in range(3):
            w.now += timedelta(seconds=10)
            assert await w.manager.run_once() == 0
    assert files(log) == ["0.log"] and log.read_bytes().startswith(b"keepkeep")
    assert len([r for r in caplog.records if "not rotated" in r.message]) == 1
    w.cri.fail_always("ReopenContainerLog", None)
    w.reopen_creates(log)
    assert await w.manager.run_once() == 1


async def test_a_missing_log_is_reopened(tmp_path: Path) -> None:
    w = World(tmp_path)
    cid, log = await w.container("app")
    log.unlink()
    w.reopen_creates(log)
    assert await w.manager.run_once() == 0
    assert log.exists() and w.cri.containers[cid].log_reopens == 1


async def test_a_symlink_is_not_rotated(tmp_path: Path) -> None:
    w = World(tmp_path)
    _, log = await w.container("app")
    secret = tmp_path / "secret"
    write(secret, "secret")
    log.unlink()
    log.symlink_to(secret)
    assert await w.manager.run_once() == 0
    assert files(log) == ["0.log"] and log.is_symlink()


async def test_workers_bound_the_concurrent_rotations(tmp_path: Path) -> None:
    w = World(tmp_path, workers=2)
    logs = [(await w.container(f"c{i}"))[1] for i in range(5)]
    for log in logs:
        write(log, "x")
    w.reopen_creates(*logs)
    in_flight, most = 0, 0

    async def slow_status() -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1

    w.cri.hooks["ContainerStatus"] = slow_status
    assert await w.manager.run_once() == 5
    assert most == 2


async def test_an_idle_round_makes_no_cri_call(tmp_path: Path) -> None:
    w = World(tmp_path)
    logs = [(await w.container(f"c{i}"))[1] for i in range(3)]
    w.cri.calls.clear()
    assert await w.manager.run_once() == 0
    # The first round asks each container for its log path, once.
    assert sorted(m for m, *_ in w.cri.calls) == ["ContainerStatus"] * 3
    w.cri.calls.clear()
    for _ in range(3):
        assert await w.manager.run_once() == 0
    assert w.cri.calls == []
    # A big log is still found and rotated without asking again.
    write(logs[0], "big")
    w.reopen_creates(logs[0])
    assert await w.manager.run_once() == 1
    assert [m for m, *_ in w.cri.calls] == ["ReopenContainerLog"]


async def test_a_new_container_is_asked_for_its_log_path_once(tmp_path: Path) -> None:
    w = World(tmp_path)
    first, _ = await w.container("a")
    assert await w.manager.run_once() == 0
    second, log = await w.container("b")
    w.cri.calls.clear()
    write(log, "big")
    w.reopen_creates(log)
    assert await w.manager.run_once() == 1
    assert [c for c in w.cri.calls if c[0] == "ContainerStatus"] == [("ContainerStatus", second)]
    # A container that stopped is not looked at.
    await w.cri.stop_container(first, timeout_s=0)
    write(w.logs_dir / f"default_web_{UID}" / "a" / "0.log", "big")
    w.cri.calls.clear()
    assert await w.manager.run_once() == 0
    assert w.cri.calls == []


def test_settings_from_the_configuration() -> None:
    k = KubeletConfiguration(
        container_log_max_size="64Ki",
        container_log_max_files=3,
        container_log_max_workers=4,
        container_log_monitor_interval=3.0,
        pod_logs_dir="/var/log/pods/",
    )
    s = LogManagerSettings.from_config(k)
    assert s == LogManagerSettings(
        policy=RotationPolicy(max_size=65536, max_files=3),
        logs_dir=Path("/var/log/pods"),
        workers=4,
        interval_s=3.0,
    )
    off = LogManagerSettings.from_config(KubeletConfiguration(container_log_max_size="-1"))
    assert not off.policy.enabled


async def test_an_idle_round_sizes_every_log_in_one_call_and_lists_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path)
    logs = [(await w.container(f"c{i}"))[1] for i in range(4)]
    assert await w.manager.run_once() == 0  # the first round learns the log paths
    batches: list[list[Path]] = []
    singles: list[Path] = []
    listed: list[str] = []
    sizes, size, listdir = logmanager._sizes, logmanager._size, os.listdir

    def count_sizes(paths: list[Path]) -> dict[Path, int]:
        batches.append(sorted(paths))
        return sizes(paths)

    def count_size(path: Path) -> int | None:
        singles.append(path)
        return size(path)

    def count_listdir(path: str | Path) -> list[str]:
        listed.append(str(path))
        return listdir(path)

    monkeypatch.setattr(logmanager, "_sizes", count_sizes)
    monkeypatch.setattr(logmanager, "_size", count_size)
    monkeypatch.setattr(os, "listdir", count_listdir)
    for i in range(3):
        logs[i].write_bytes(b"x" * 999)  # one byte under the max size
    assert await w.manager.run_once() == 0
    assert (batches, singles, listed) == ([sorted(logs)], [], [])
    # A log at its max size, and one that went missing, are looked at on their own.
    write(logs[0], "big")
    w.reopen_creates(logs[0], logs[3])
    logs[3].unlink()
    batches.clear()
    assert await w.manager.run_once() == 1
    assert batches == [sorted(logs)]
    assert set(singles) == {logs[0], logs[3]}
    assert listed == [str(logs[0].parent)]

"""Container log rotation: the I/O around `logrotation.plan_rotation`.

Why syncloop: it creates every container and its log directory, and it is the service
whose leader alone acts on the runtime; the loop runs as a lease-gated root task, so two
replicas never rotate the same file. Every `containerLogMonitorInterval` (upstream: 10 s)
each running container is looked at by one of `containerLogMaxWorkers` workers: its log
path, its size, the names around it; then the plan is carried out in order (remove,
gzip, rename the current log) and CRI ReopenContainerLog makes the runtime write a new
file.

Upstream lists every container (ListContainers) and asks each running one for its log
path (ContainerStatus) every round: at 110 pods, 111 CRI calls each 10 s on an idle node
(issue 42). Here the running containers are the ones PLEG last saw running (relisting:
its relists, the workers' reads and the runtime's events keep that view), and a
container's log path, which CRI fixes when the container is created, is asked once per
container: an idle round makes no CRI call. A container PLEG has not seen yet waits for
the next round; one that exited since is found by ReopenContainerLog failing, as a
container exiting after upstream's list would be. When the
reopen fails the rename is undone so the next round tries again, as upstream does.

A round sizes every known log in one worker-thread call (`_sizes`) and goes further
only for a log at its max size or one that could not be sized: at 110 pods an idle
round was 220 thread hand-offs (a stat and a directory listing per container, each
waking a worker thread and the event loop), now one (issue 42).
A log that is missing is reopened first (upstream's rule), so a file deleted by hand
comes back.

Only logs under this node's podLogsDir are touched: the runtime may be shared with
other agents (the integration tests share one containerd), and a log path is data from
the runtime, not a licence to rename anything on the host. Files are opened without
following symlinks, so a pod that can write into the log directory cannot make the
compression read another file.

Errors are logged once per distinct error and container, not every round.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from klet.cri.errors import CRIError
from klet.cri.types import ContainerStatusInfo
from klet.model.logfiles import COMPRESSED_SUFFIX, TEMPORARY_SUFFIX
from klet.model.types import ContainerID
from klet.model.units import parse_quantity_int
from klet.obs import OnceLogger
from klet.syncloop.containers.logrotation import (
    RotationPlan,
    RotationPolicy,
    needs_rotation,
    plan_rotation,
)

log = logging.getLogger(__name__)

_COPY_CHUNK = 1 << 20


class LogRuntime(Protocol):
    """What log rotation asks the runtime (klet.cri.RuntimeClient conforms)."""

    async def container_status(self, container_id: ContainerID) -> ContainerStatusInfo: ...

    async def reopen_container_log(self, container_id: ContainerID) -> None: ...


class LogConfig(Protocol):
    """The KubeletConfiguration fields of log rotation."""

    @property
    def container_log_max_size(self) -> str: ...

    @property
    def container_log_max_files(self) -> int: ...

    @property
    def container_log_max_workers(self) -> int: ...

    @property
    def container_log_monitor_interval(self) -> float: ...

    @property
    def pod_logs_dir(self) -> str: ...


@dataclass(frozen=True)
class LogManagerSettings:
    policy: RotationPolicy
    logs_dir: Path
    """[podLogsDir]: only logs below it are rotated."""
    workers: int = 1
    """[containerLogMaxWorkers]."""
    interval_s: float = 10.0
    """[containerLogMonitorInterval]."""

    @classmethod
    def from_config(cls, k: LogConfig) -> LogManagerSettings:
        return cls(
            policy=RotationPolicy(
                max_size=parse_quantity_int(k.container_log_max_size),
                max_files=k.container_log_max_files,
            ),
            logs_dir=Path(os.path.normpath(k.pod_logs_dir)),
            workers=max(1, k.container_log_max_workers),
            interval_s=k.container_log_monitor_interval,
        )


class RotationError(Exception):
    """One container's log could not be rotated (the message says which step)."""


RunningContainers = Callable[[], Iterable[ContainerID]]
"""The node's running containers (PLEG's view: Relister.running_containers)."""


class ContainerLogManager:
    def __init__(
        self,
        runtime: LogRuntime,
        running: RunningContainers,
        settings: LogManagerSettings,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.runtime = runtime
        self.running = running
        self.settings = settings
        self.clock = clock
        self._once = OnceLogger(log, level=logging.WARNING)
        # Container -> its log file under logs_dir, or None (no log, or not this node's).
        self._paths: dict[ContainerID, Path | None] = {}

    async def run(self) -> None:
        if not self.settings.policy.enabled:
            log.info("container log rotation is off (containerLogMaxSize < 0)")
            await asyncio.Event().wait()
        log.info(
            "container log rotation",
            extra={
                "max_size": self.settings.policy.max_size,
                "max_files": self.settings.policy.max_files,
                "workers": self.settings.workers,
                "interval_s": self.settings.interval_s,
            },
        )
        while True:
            await self.run_once()
            await asyncio.sleep(self.settings.interval_s)

    async def run_once(self) -> int:
        """One round over the running containers; returns how many logs were rotated."""
        running = list(dict.fromkeys(self.running()))
        self._once.retain(running)
        keep = set(running)
        for gone in [cid for cid in self._paths if cid not in keep]:
            del self._paths[gone]
        workers = asyncio.Semaphore(self.settings.workers)
        known = [p for cid in running if (p := self._paths.get(cid)) is not None]
        sizes = await asyncio.to_thread(_sizes, known) if known else {}

        async def one(cid: ContainerID) -> bool:
            async with workers:
                try:
                    rotated = await self.rotate_if_needed(cid, sizes=sizes)
                except (CRIError, OSError, RotationError) as err:
                    self._report(cid, err)
                    return False
                self._once.clear(cid, "container log rotated again", container=cid)
                return rotated

        results = await asyncio.gather(*(one(cid) for cid in running))
        return sum(results)

    def _report(self, cid: ContainerID, err: Exception) -> None:
        self._once.error(
            cid, "container log not rotated", cause=str(err), container=cid, error=str(err)
        )

    async def _log_path(self, cid: ContainerID) -> Path | None:
        """The container's log under logs_dir, asked of CRI once per container."""
        if cid in self._paths:
            return self._paths[cid]
        status = await self.runtime.container_status(cid)
        path = _own_log(status.log_path, self.settings.logs_dir) if status.log_path else None
        self._paths[cid] = path
        return path

    async def rotate_if_needed(
        self, cid: ContainerID, *, sizes: Mapping[Path, int] | None = None
    ) -> bool:
        """Rotate the container's log if it is due; `sizes` are the round's sizes of
        regular log files (`_sizes`): a log among them below its max size is done."""
        path = await self._log_path(cid)
        if path is None:
            return False  # no log, or not a log of this node's pods
        known = (sizes or {}).get(path)
        if known is not None and not needs_rotation(known, self.settings.policy):
            return False
        size = await asyncio.to_thread(_size, path)
        if size is None:
            # Upstream: a log that disappeared is reopened, so the container logs again.
            await self.runtime.reopen_container_log(cid)
            size = await asyncio.to_thread(_size, path)
            if size is None:
                raise RotationError(f"log {path} missing after ReopenContainerLog")
        if not needs_rotation(size, self.settings.policy):
            return False  # nothing to plan: the directory is not listed
        names = await asyncio.to_thread(os.listdir, path.parent)
        plan = plan_rotation(
            path.name, names, size=size, policy=self.settings.policy, now=self.clock()
        )
        if plan.empty:
            return False
        await asyncio.to_thread(_tidy, path.parent, plan)
        rotated = path.parent / plan.rotate_to
        await asyncio.to_thread(os.rename, path, rotated)
        try:
            await self.runtime.reopen_container_log(cid)
        except CRIError as err:
            # Put it back so the next round tries again; should that fail too, the
            # lines stay in the rotated file, which readers still see.
            try:
                await asyncio.to_thread(os.rename, rotated, path)
            except OSError as back:
                log.error(
                    "rotated log not renamed back",
                    extra={"container": cid, "path": str(rotated), "error": str(back)},
                )
            raise RotationError(f"ReopenContainerLog of {cid} failed: {err}") from err
        log.debug("rotated container log", extra={"container": cid, "path": str(rotated)})
        return True


def _own_log(log_path: str, logs_dir: Path) -> Path | None:
    """The log path, normalised, when it lies below `logs_dir`."""
    path = Path(os.path.normpath(log_path))
    if path == logs_dir or not path.is_relative_to(logs_dir):
        return None
    return path


def _sizes(paths: Iterable[Path]) -> dict[Path, int]:
    """The sizes of those of `paths` that are regular files (blocking: one worker
    thread's call per round); a missing or odd one is left to `_size`'s checks."""
    out: dict[Path, int] = {}
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[path] = st.st_size
    return out


def _size(path: Path) -> int | None:
    """The log's size; None when it does not exist. Raises RotationError when it is not a
    regular file (a symlink planted there is not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise RotationError(f"log {path} is not a regular file")
    return st.st_size


def _tidy(directory: Path, plan: RotationPlan) -> None:
    for name in plan.remove:
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise RotationError(f"cannot remove old log {directory / name}: {err}") from err
    for name in plan.compress:
        try:
            _compress(directory / name)
        except OSError as err:
            raise RotationError(f"cannot compress log {directory / name}: {err}") from err


def _compress(path: Path) -> None:
    """`path` → `path.gz` through `path.tmp`, then `path` removed."""
    tmp = path.with_name(path.name + TEMPORARY_SUFFIX)
    src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = stat.S_IMODE(os.fstat(src).st_mode)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        dst = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode
        )
        try:
            with (
                open(src, "rb", closefd=False) as reader,
                open(dst, "wb", closefd=False) as raw,
                gzip.GzipFile(fileobj=raw, mode="wb", filename="") as writer,
            ):
                shutil.copyfileobj(reader, writer, _COPY_CHUNK)
        except BaseException:
            os.close(dst)
            os.unlink(tmp)
            raise
        os.close(dst)
    finally:
        os.close(src)
    os.rename(tmp, path.with_name(path.name + COMPRESSED_SUFFIX))
    os.unlink(path)

"""Port files: where each replica of a service serves its private port.

A service writes them once its /healthz /readyz /metrics port listens and removes them
on a clean exit (`PortFiles`):

- the published file, `<run-dir>/ports/<service>/<hostname>-<pid>-<token>.json`
  (klet.model.layout), one per replica, from which operators and scrapers discover
  replicas on ephemeral ports (`--service-port=0`): `live_replicas(run_dir, service)`;
- optionally a private file (`--service-port-file`) for `klet healthcheck` run inside
  the replica's own container: a path no other replica shares (compose puts it in the
  container's own filesystem). It is removed before the port is bound, so one left by
  an earlier run of the same container never points the check at someone else's port.

Both hold the same JSON record (`PortRecord`: service, host, port, pid, hostname) and
are written under a temporary name then renamed, so a reader sees a whole file or none.
Directories are 0700, files 0644 (a port number is no secret).

A published file's liveness is a lock, not its pid: the writer holds an exclusive
`flock` on it for its whole life (taken before the rename, so the file never appears
unlocked) and the kernel drops the lock when the process is gone, however it ended. A
reader that gets the lock knows the writer is dead, skips the file and removes it. A
pid would not do: in a container without the host's PID namespace every replica may
be pid 1, and a dead replica's pid may be reused. A stopped or hung replica keeps its
lock and stays listed; its port not answering is what a scraper should see.

Trade-off: publishing is best effort, as the lease's replica slot (klet.bus.holder): a
run directory that cannot be written is logged and the service runs on. The private
file is what the container's health check reads, so failing to write it is an error.

This module imports nothing heavy: `klet healthcheck` runs it every few seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from klet.model.layout import PORTS_DIR, port_file, port_files_dir, replica_name

__all__ = [
    "PortFiles",
    "PortRecord",
    "live_replica_files",
    "live_replicas",
    "read_port_file",
    "remove_port_file",
]

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o644
_MAX_SIZE = 4096


@dataclass(frozen=True)
class PortRecord:
    """What a port file says: `service`'s port listens on host:port in process `pid` of
    `hostname` (host as bound: a wildcard address means every local one)."""

    service: str
    host: str
    port: int
    pid: int
    hostname: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PortRecord:
        """Raises ValueError when `text` is not a port record."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        fields = {"service": str, "host": str, "port": int, "pid": int, "hostname": str}
        for name, kind in fields.items():
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{name}: expected {kind.__name__}, got {value!r}")
        if not 0 < data["port"] <= 65535:
            raise ValueError(f"port: out of range: {data['port']}")
        return cls(**{name: data[name] for name in fields})


def read_port_file(path: Path) -> PortRecord:
    """The record in `path`. Raises FileNotFoundError when there is none and
    ValueError when the file is not a port file."""
    with open(path, "rb") as f:
        data = f.read(_MAX_SIZE + 1)
    if len(data) > _MAX_SIZE:
        raise ValueError(f"{path}: larger than {_MAX_SIZE} bytes")
    return PortRecord.from_json(data.decode("utf-8", "replace"))


def remove_port_file(path: Path | None) -> None:
    """Remove a private port file an earlier run left, if any (None: there is none)."""
    if path is not None:
        path.unlink(missing_ok=True)


def _write_new(path: Path, text: str, *, lock: bool) -> int:
    """Write `text` under a temporary name beside `path`, lock it (`lock`), rename it
    over `path`; returns the still open file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # whatever the umask
        if lock:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


def _make_dirs(run_dir: Path, service: str) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    for directory in (run_dir / PORTS_DIR, port_files_dir(run_dir, service)):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)
    return port_files_dir(run_dir, service)


def _read_if_live(path: Path, *, remove_dead: bool) -> PortRecord | None:
    """The record of a live writer's file; None (and the file removed) for a dead one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # the writer holds its lock: alive
            data = os.read(fd, _MAX_SIZE)
            try:
                return PortRecord.from_json(data.decode("utf-8", "replace"))
            except ValueError as err:
                log.warning(
                    "ignoring a malformed port file", extra={"path": str(path), "error": str(err)}
                )
                return None
        if remove_dead:
            with contextlib.suppress(OSError):
                # The same file still: not one a new writer just renamed to this name.
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(path)
                    log.debug("removed a dead replica's port file", extra={"path": str(path)})
        return None
    finally:
        os.close(fd)


def live_replicas(run_dir: Path, service: str, *, remove_dead: bool = True) -> list[PortRecord]:
    """The published records of `service`'s live replicas, sorted by file name; files of
    dead replicas are skipped and (`remove_dead`, when the directory is writable)
    removed."""
    return [record for _, record in live_replica_files(run_dir, service, remove_dead=remove_dead)]


def live_replica_files(
    run_dir: Path, service: str, *, remove_dead: bool = True
) -> list[tuple[Path, PortRecord]]:
    """`live_replicas` with the file each record was read from (for a reader that must
    name the file it refuses)."""
    directory = port_files_dir(run_dir, service)
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue  # a writer's temporary file
        record = _read_if_live(directory / name, remove_dead=remove_dead)
        if record is not None:
            found.append((directory / name, record))
    return found


class PortFiles:
    """This process's port files for `service`: `run_dir` None publishes none,
    `private_file` None writes no private file."""

    def __init__(
        self,
        service: str,
        *,
        run_dir: Path | None,
        private_file: Path | None = None,
        hostname: str | None = None,
        pid: int | None = None,
        token: str | None = None,
    ) -> None:
        self.service = service
        self.hostname = socket.gethostname() if hostname is None else hostname
        self.pid = os.getpid() if pid is None else pid
        self.token = secrets.token_hex(4) if token is None else token
        self.run_dir = run_dir
        self.private_file = private_file
        self.published = (
            port_file(run_dir, service, replica_name(self.hostname, self.pid, self.token))
            if run_dir is not None
            else None
        )
        self._held: int | None = None  # the published file, locked while open

    def clear_private(self) -> None:
        """Remove the private file a previous run may have left (before binding)."""
        remove_port_file(self.private_file)

    def publish(self, host: str, port: int) -> PortRecord:
        """Write both files for a port now listening on host:port."""
        record = PortRecord(self.service, host, port, self.pid, self.hostname)
        if self.private_file is not None:
            os.close(_write_new(self.private_file, record.to_json(), lock=False))
        if self.run_dir is not None and self.published is not None:
            try:
                _make_dirs(self.run_dir, self.service)
                live_replicas(self.run_dir, self.service)  # clears dead replicas' files
                fd = _write_new(self.published, record.to_json(), lock=True)
            except OSError as err:
                log.warning(
                    "cannot publish the service port; replicas on this run directory "
                    "cannot be discovered",
                    extra={"path": str(self.published), "error": str(err)},
                )
            else:
                previous, self._held = self._held, fd
                if previous is not None:  # published again: the rename replaced that file
                    os.close(previous)
        log.info(
            "service port published",
            extra={
                "port": port,
                "host": host,
                "port_file": str(self.published) if self._held is not None else None,
                "private_port_file": str(self.private_file) if self.private_file else None,
            },
        )
        return record

    def _withdraw_published(self) -> None:
        """Remove the published file and drop its lock."""
        if self._held is None:
            return
        fd, self._held = self._held, None
        if self.published is not None:
            with contextlib.suppress(OSError):
                if os.stat(self.published, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(self.published)
        os.close(fd)

    def withdraw(self) -> None:
        """Remove both files (clean exit): the port no longer listens."""
        self._withdraw_published()
        if self.private_file is not None:
            with contextlib.suppress(OSError):
                self.private_file.unlink(missing_ok=True)

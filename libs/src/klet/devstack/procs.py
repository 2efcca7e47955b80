"""Child daemons for the dev stack: start, wait for readiness, stop by PID.

Every component of the dev stack (Redis, the registry, containerd) is a plain child
process in its own session, logging to a file in its own directory. Nothing is ever
stopped by name: other stacks, or a system instance, may run the same binary on this
machine. A pidfile lets a later run of the same directory stop what a crashed run left
behind, after checking that the PID still runs the recorded command line (PIDs are
reused).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40


class StartError(RuntimeError):
    """A component did not start or did not become ready in time."""


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """Return a TCP port that was free on every address a moment ago.

    It is picked below the kernel's ephemeral range: a port the kernel hands out on
    bind(0) may be given next to any outgoing connection's source port, and on a busy
    machine one took a daemon's port between this check and its bind. Ports handed out
    by this process are not handed out again. The daemons here fail loudly if a port is
    taken all the same.
    """
    high = min(_ephemeral_low(), 65536) - 1
    low = 10000 if high > 12000 else 1024
    for _ in range(200):
        port = random.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        fallback: int = sock.getsockname()[1]
        return fallback


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file, or a note if it cannot be read."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def read_cmdline(pid: int) -> list[str] | None:
    """The argv of a running process, or None if it is gone (or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    return raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may hold spaces.
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X", "")


def kill_pid(pid: int, *, timeout_s: float = 10.0) -> None:
    """SIGTERM a process, then SIGKILL it if it outlives ``timeout_s``.

    Works for processes that are not our children (shims, leftovers): their exit is
    observed through /proc, not wait().
    """
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.02)
    log.warning("process survived SIGKILL pid=%d", pid)


class Pidfile:
    """A JSON pidfile recording the PID and argv of a daemon we started.

    The argv is kept so that a stale file whose PID was reused by an unrelated process
    never leads to killing that process.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, pid: int, argv: Sequence[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": pid, "argv": list(argv)}))
        tmp.replace(self.path)

    def read(self) -> tuple[int, list[str]] | None:
        try:
            data = json.loads(self.path.read_text())
            return int(data["pid"]), [str(a) for a in data["argv"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def stop_leftover(self, *, timeout_s: float = 10.0) -> bool:
        """Stop the process a previous run left behind, if it is still that process.

        Returns whether a process was stopped.
        """
        entry = self.read()
        stopped = False
        if entry is not None:
            pid, argv = entry
            if read_cmdline(pid) == argv:
                log.warning("stopping leftover process pid=%d argv=%s", pid, argv[0])
                kill_pid(pid, timeout_s=timeout_s)
                stopped = True
        self.remove()
        return stopped


class ManagedProcess:
    """One daemon run as a child in its own session, logging to ``<dir>/<name>.log``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        dir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.dir = dir
        self.env = dict(env) if env is not None else None
        self.log_path = dir / f"{name}.log"
        self.pidfile = Pidfile(dir / f"{name}.pid")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Spawn the process (stopping a leftover of a previous run of this directory)."""
        if self.alive:
            raise StartError(f"{self.name} is already running (pid {self.pid})")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pidfile.stop_leftover()
        self._log = self.log_path.open("ab")
        self._log.write(f"--- {time.strftime('%H:%M:%S')} start {self.argv}\n".encode())
        self._log.flush()
        try:
            # A session of its own keeps Ctrl-C in a terminal from reaching the daemon
            # before we stop it in order.
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=self.env,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise StartError(f"cannot start {self.name} ({self.argv[0]}): {exc}") from exc
        self.pidfile.write(self._proc.pid, self.argv)
        log.debug("started %s pid=%d", self.name, self._proc.pid)

    def wait_ready(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``check`` until it returns True; raise StartError with the log tail if not.

        Exceptions from ``check`` count as "not yet": daemons refuse connections until
        they listen.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            if not self.alive:
                code = self._proc.returncode if self._proc is not None else None
                raise StartError(
                    f"{self.name} exited (code {code}) before {what}; "
                    f"last lines of {self.log_path}:\n{tail(self.log_path)}"
                )
            try:
                if check():
                    return
            except Exception as exc:
                log.debug("%s not ready: %s", self.name, exc)
            if time.monotonic() >= deadline:
                raise StartError(
                    f"{self.name} not ready after {timeout_s:.0f}s: {what}; "
                    f"last lines of {self.log_path}:\n{tail(self.log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process, SIGKILL it after ``timeout_s``; return its exit code."""
        proc = self._proc
        if proc is None:
            return None
        code = proc.poll()
        if code is None:
            try:
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s ignored SIGTERM for %.0fs, killing pid=%d", self.name, timeout_s, proc.pid
                )
                proc.kill()
                code = proc.wait()
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
                code = proc.wait()
        self._proc = None
        self.pidfile.remove()
        self._close_log()
        return code

    def kill(self) -> int | None:
        """SIGKILL the process at once (tests use it to simulate a crash)."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        self._proc = None
        self.pidfile.remove()
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

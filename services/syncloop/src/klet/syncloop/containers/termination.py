"""Termination messages: the file a container writes on its way out, and its log tail.

As upstream: before each container instance is created, an empty file (mode 0666, so
any user in the container can write it) is made under the pod's directory in the
kubelet root dir, `<root>/pods/<uid>/containers/<name>/<8 hex digits>`, and mounted at
the container's `terminationMessagePath` (default `/dev/termination-log`; an empty
path means no file). Once the container has exited, the runtime adapter (runtime.py)
reads it through the mount the runtime reports: at most the last 4096 bytes. With
`terminationMessagePolicy: FallbackToLogsOnError`, a failed container (non-zero exit,
not `ContainerCannotRun`) whose file is missing or empty gets the tail of its log
instead: the last 80 lines, at most 2048 bytes. The text is appended to the runtime's
own message (`<runtime message>: <text>`), and the status then trims every terminated
message of a pod to an equal share of 12 KiB, as upstream's status manager does.

The readers are small, bounded local reads (a seek to the end of the file), so they
run inline rather than in a thread. The pure parts (fallback rule, CRI log parsing,
the pod-wide trim) are separate functions with their own tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
from pathlib import Path

from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, Mount
from klet.model.layout import pod_dir
from klet.model.podvalidation import UnsafePathComponent, checked_component
from klet.model.types import JSON

log = logging.getLogger(__name__)

DEFAULT_PATH = "/dev/termination-log"
DEFAULT_POLICY = "File"
FALLBACK_TO_LOGS = "FallbackToLogsOnError"
MAX_CONTAINER_BYTES = 4 * 1024  # MaxContainerTerminationMessageLength
MAX_POD_BYTES = 12 * 1024  # MaxPodTerminationMessageLogLength
MAX_LOG_BYTES = 2 * 1024  # MaxContainerTerminationMessageLogLength
MAX_LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
FILE_MODE = 0o666
_BLOCK = 64 * 1024


def message_path(container: JSON) -> str:
    """Where the container's termination message goes ("" when it asked for none)."""
    path = container.get("terminationMessagePath")
    return DEFAULT_PATH if path is None else str(path)


def containers_dir(root_dir: Path, uid: str) -> Path:
    return pod_dir(root_dir, checked_component(uid, what="pod UID")) / "containers"


def create_message_file(root_dir: Path, uid: str, container: JSON) -> Mount | None:
    """Make a fresh, empty message file for one container instance; its mount, or None.

    A file that cannot be made is logged and the container runs without one, as upstream.
    """
    path = message_path(container)
    if not path or not uid:
        return None
    directory = containers_dir(root_dir, uid) / checked_component(
        str(container["name"]), what="container name"
    )
    host = directory / secrets.token_hex(4)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        host.touch(exist_ok=False)
        # touch() honours the umask; the container's user may not be root.
        os.chmod(host, FILE_MODE)
    except OSError as err:
        log.error(
            "cannot create termination-log file", extra={"path": str(host), "error": str(err)}
        )
        return None
    return Mount(container_path=path, host_path=str(host))


def mounts_for(root_dir: Path | None, pod: JSON, container: JSON) -> tuple[Mount, ...]:
    """The mounts a new container instance needs for its message (none without a root dir)."""
    if root_dir is None:
        return ()
    mount = create_message_file(
        root_dir, str((pod.get("metadata") or {}).get("uid", "")), container
    )
    return (mount,) if mount is not None else ()


def remove_pod_files(root_dir: Path, uid: str) -> None:
    """Remove the pod's message files, and its directory when nothing else is left in it."""
    if not uid:
        return
    try:
        directory = containers_dir(root_dir, uid)
    except UnsafePathComponent:
        return  # a UID read from the runtime's labels that no pod directory can have
    shutil.rmtree(directory, ignore_errors=True)
    try:
        directory.parent.rmdir()
    except OSError:
        pass  # absent, or holds something else (volumes): not ours to remove


def should_read_logs(policy: str, exit_code: int, reason: str) -> bool:
    """FallbackToLogsOnError applies to a failed container that got to run."""
    return policy == FALLBACK_TO_LOGS and exit_code != 0 and reason != "ContainerCannotRun"


def read_tail(path: str, limit: int) -> bytes:
    """At most the last `limit` bytes of the file (upstream's tail.ReadAtMost)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit)


def _last_lines(path: str, lines: int) -> bytes:
    """The last `lines` newline-terminated records of the file (and any unterminated end)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        pos = end
        while pos > 0:
            step = min(_BLOCK, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
            # One newline more than lines: the first record kept is then complete.
            if data.count(b"\n") > lines:
                break
    records = data.split(b"\n")
    if records[-1] == b"":
        records.pop()  # the file ends with a newline: no record after it
    return b"\n".join(records[-lines:])


def cri_log_content(raw: bytes) -> bytes:
    """The container output in CRI log records (`<time> <stream> <P|F> <text>`).

    A partial record (P) continues in the next one; a full one (F) ends a line.
    Records that do not parse are skipped.
    """
    out = bytearray()
    for record in raw.split(b"\n"):
        parts = record.split(b" ", 3)
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
            continue
        tag = parts[2]
        text = parts[3] if len(parts) == 4 else b""
        out += text
        if not tag.startswith(b"P"):
            out += b"\n"
    return bytes(out)


def log_tail(path: str, *, lines: int = MAX_LOG_LINES, limit: int = MAX_LOG_BYTES) -> str:
    """The last `lines` lines of a CRI log, at most `limit` bytes of them (the end)."""
    try:
        content = cri_log_content(_last_lines(path, lines))
    except OSError as err:
        return f"Error on reading termination message from logs: {err}"
    return content[-limit:].decode(errors="replace")


def _read_message(status: ContainerStatusInfo, path: str, fallback: bool) -> tuple[str, bool]:
    """(message from the file, whether the logs should be read instead)."""
    if not path:
        return "", fallback
    mount = next((m for m in status.mounts if m.container_path == path), None)
    if mount is None:
        return "", fallback
    try:
        data = read_tail(mount.host_path, MAX_CONTAINER_BYTES)
    except FileNotFoundError:
        return "", fallback
    except OSError as err:
        return f"Error on reading termination log {mount.host_path}: {err}", False
    return data.decode(errors="replace"), fallback and not data


def with_message(status: ContainerStatusInfo) -> ContainerStatusInfo:
    """An exited container's status with its termination message appended to `message`."""
    if status.state != ContainerState.EXITED:
        return status
    annotations = status.annotations
    policy = annotations.get(L.TERMINATION_MESSAGE_POLICY, DEFAULT_POLICY)
    path = annotations.get(L.TERMINATION_MESSAGE_PATH, "")
    fallback = should_read_logs(policy, status.exit_code, status.reason)
    text, check_logs = _read_message(status, path, fallback)
    if check_logs and status.log_path:
        text = log_tail(status.log_path)
    if not text:
        return status
    message = f"{status.message}: {text}" if status.message else text
    return dataclasses.replace(status, message=message)


def _truncate(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")


def trim_pod_messages(pod: JSON, statuses: list[JSON]) -> None:
    """Cut every terminated message to an equal share of the pod's 12 KiB (in place)."""
    spec = pod.get("spec") or {}
    count = len(spec.get("containers") or []) + len(spec.get("initContainers") or [])
    per_container = MAX_POD_BYTES // count if count else MAX_POD_BYTES
    for s in statuses:
        for key in ("state", "lastState"):
            terminated = (s.get(key) or {}).get("terminated")
            if terminated and terminated.get("message"):
                terminated["message"] = _truncate(terminated["message"], per_container)

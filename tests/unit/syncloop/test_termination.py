"""Termination messages: the per-instance message file, reading it after the exit.

Covers where the file goes (`<root>/pods/<uid>/containers/<name>/<8 hex>`, mode 0666,
mounted at terminationMessagePath, none for an empty path), what is read back (the last
4096 bytes, appended to the runtime's own message), FallbackToLogsOnError (the tail of
the CRI log — last 80 lines, at most 2048 bytes — only for a failed container whose
file is missing or empty, never for ContainerCannotRun), CRI log parsing (partial
records joined), the pod-wide 12 KiB trim and the removal of a pod's files.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from klet.cri import labels as L
from klet.cri.types import ContainerState, ContainerStatusInfo, Mount
from klet.model.types import ContainerID
from klet.syncloop.containers import termination

POD = {"metadata": {"uid": "u1", "name": "p", "namespace": "default"}}


def exited(
    *,
    path: str = "/dev/termination-log",
    policy: str = "File",
    exit_code: int = 1,
    reason: str = "Error",
    message: str = "",
    mounts: tuple[Mount, ...] = (),
    log_path: str = "",
    state: ContainerState = ContainerState.EXITED,
) -> ContainerStatusInfo:
    return ContainerStatusInfo(
        id=ContainerID("c1"),
        name="main",
        attempt=0,
        state=state,
        created_at=1,
        started_at=2,
        finished_at=3,
        exit_code=exit_code,
        image="img",
        image_ref="sha256:x",
        reason=reason,
        message=message,
        log_path=log_path,
        annotations={L.TERMINATION_MESSAGE_PATH: path, L.TERMINATION_MESSAGE_POLICY: policy},
        mounts=mounts,
    )


def cri_log(path: Path, lines: list[str], *, stream: str = "stdout") -> None:
    path.write_text(
        "".join(f"2024-01-01T00:00:00.{i:09d}Z {stream} F {line}\n" for i, line in enumerate(lines))
    )


def test_message_file_is_fresh_world_writable_and_mounted(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        first = termination.create_message_file(tmp_path, "u1", {"name": "main"})
        second = termination.create_message_file(tmp_path, "u1", {"name": "main"})
    finally:
        os.umask(old)
    assert first is not None and second is not None
    assert first.container_path == "/dev/termination-log" and not first.readonly
    host = Path(first.host_path)
    assert host.parent == tmp_path / "pods" / "u1" / "containers" / "main"
    assert len(host.name) == 8 and int(host.name, 16) >= 0
    assert host.read_bytes() == b""
    assert stat.S_IMODE(host.stat().st_mode) == 0o666
    assert second.host_path != first.host_path  # one file per container instance


def test_message_file_follows_the_spec_path_and_none_for_an_empty_one(tmp_path: Path) -> None:
    custom = termination.create_message_file(
        tmp_path, "u1", {"name": "main", "terminationMessagePath": "/tmp/why"}
    )
    assert custom is not None and custom.container_path == "/tmp/why"
    assert (
        termination.create_message_file(
            tmp_path, "u1", {"name": "main", "terminationMessagePath": ""}
        )
        is None
    )
    assert termination.mounts_for(None, POD, {"name": "main"}) == ()
    [mount] = termination.mounts_for(tmp_path, POD, {"name": "main"})
    assert Path(mount.host_path).is_relative_to(tmp_path / "pods" / "u1")


def test_the_file_is_read_once_exited_and_appended_to_the_runtime_message(tmp_path: Path) -> None:
    host = tmp_path / "msg"
    host.write_text("bye\n")
    mounts = (Mount("/other", "/nonexistent"), Mount("/dev/termination-log", str(host)))
    assert termination.with_message(exited(mounts=mounts)).message == "bye\n"
    assert termination.with_message(exited(mounts=mounts, message="OOMKilled")).message == (
        "OOMKilled: bye\n"
    )
    running = exited(mounts=mounts, state=ContainerState.RUNNING)
    assert termination.with_message(running) is running
    # No mount for the path (an empty terminationMessagePath): nothing to read.
    assert termination.with_message(exited(mounts=mounts, path="")).message == ""


def test_only_the_last_4096_bytes_of_the_file_are_read(tmp_path: Path) -> None:
    host = tmp_path / "msg"
    host.write_bytes(b"a" * 5000 + b"b" * 4000)
    status = exited(mounts=(Mount("/dev/termination-log", str(host)),))
    message = termination.with_message(status).message
    assert len(message) == 4096 and message == "a" * 96 + "b" * 4000


def test_an_unreadable_file_is_reported_as_the_message(tmp_path: Path) -> None:
    directory = tmp_path / "dir"
    directory.mkdir()  # reading a directory fails with something other than not-found
    status = exited(mounts=(Mount("/dev/termination-log", str(directory)),))
    message = termination.with_message(status).message
    assert message.startswith(f"Error on reading termination log {directory}: ")


@pytest.mark.parametrize(
    ("policy", "exit_code", "reason", "file_text", "expected"),
    [
        ("FallbackToLogsOnError", 1, "Error", "", "log line 1\nlog line 2\n"),
        ("FallbackToLogsOnError", 1, "Error", None, "log line 1\nlog line 2\n"),  # no file
        ("FallbackToLogsOnError", 1, "Error", "from file", "from file"),
        ("FallbackToLogsOnError", 0, "Completed", "", ""),
        ("FallbackToLogsOnError", 128, "ContainerCannotRun", "", ""),
        ("File", 1, "Error", "", ""),
    ],
)
def test_fallback_to_logs_on_error(
    tmp_path: Path,
    policy: str,
    exit_code: int,
    reason: str,
    file_text: str | None,
    expected: str,
) -> None:
    log = tmp_path / "0.log"
    cri_log(log, ["log line 1", "log line 2"])
    host = tmp_path / "msg"
    if file_text is not None:
        host.write_text(file_text)
    status = exited(
        policy=policy,
        exit_code=exit_code,
        reason=reason,
        mounts=(Mount("/dev/termination-log", str(host)),),
        log_path=str(log),
    )
    assert termination.with_message(status).message == expected


def test_the_log_tail_is_the_last_80_lines_and_at_most_2048_bytes(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    cri_log(log, [f"line {i}" for i in range(100)])
    tail = termination.log_tail(str(log))
    assert tail.splitlines() == [f"line {i}" for i in range(20, 100)]
    cri_log(log, ["x" * 1000, "y" * 1000, "z" * 1000])
    tail = termination.log_tail(str(log))
    assert len(tail) == 2048 and tail.endswith("z" * 1000 + "\n")
    assert termination.log_tail(str(tmp_path / "missing.log")).startswith(
        "Error on reading termination message from logs: "
    )


def test_the_log_tail_reads_back_across_blocks(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    cri_log(log, [f"{i:05d}" + "." * 2000 for i in range(200)])  # ~400 KB, many blocks
    tail = termination.log_tail(str(log), lines=80, limit=10**9)
    lines = tail.splitlines()
    assert len(lines) == 80 and lines[0].startswith("00120") and lines[-1].startswith("00199")


@pytest.mark.parametrize(
    ("raw", "content"),
    [
        (b"T stdout F hello\n", b"hello\n"),
        (b"T stdout P hel\nT stdout F lo\n", b"hello\n"),
        (b"T stderr F oops\nT stdout F ok\n", b"oops\nok\n"),
        (b"T stdout F \n", b"\n"),  # an empty line
        (b"garbage\nT stdout F kept\n", b"kept\n"),
        (b"T stdout F a\rb\n", b"a\rb\n"),  # a carriage return is content, not a record end
    ],
)
def test_cri_log_records(raw: bytes, content: bytes) -> None:
    assert termination.cri_log_content(raw) == content


def _status(message: str, *, last: str = "") -> dict[str, Any]:
    s: dict[str, Any] = {"state": {"terminated": {"message": message}}, "lastState": {}}
    if last:
        s["lastState"] = {"terminated": {"message": last}}
    return s


@pytest.mark.parametrize(
    ("containers", "inits", "share"), [(1, 0, 12288), (2, 1, 4096), (4, 0, 3072)]
)
def test_pod_messages_share_12_kib(containers: int, inits: int, share: int) -> None:
    pod = {
        "spec": {
            "containers": [{"name": f"c{i}"} for i in range(containers)],
            "initContainers": [{"name": f"i{i}"} for i in range(inits)],
        }
    }
    statuses = [
        _status("m" * 20000, last="l" * 20000),
        _status("short"),
        {"state": {"running": {}}},
    ]
    termination.trim_pod_messages(pod, statuses)
    assert len(statuses[0]["state"]["terminated"]["message"]) == share
    assert len(statuses[0]["lastState"]["terminated"]["message"]) == share
    assert statuses[1]["state"]["terminated"]["message"] == "short"
    assert statuses[2] == {"state": {"running": {}}}


def test_trim_never_splits_a_character() -> None:
    statuses = [_status("é" * 7000)]  # 2 bytes each: 14000 bytes
    termination.trim_pod_messages({"spec": {"containers": [{"name": "a"}]}}, statuses)
    message = statuses[0]["state"]["terminated"]["message"]
    assert message == "é" * 6144 and len(message.encode()) == 12288


def test_pod_files_are_removed_but_not_what_else_lives_there(tmp_path: Path) -> None:
    termination.create_message_file(tmp_path, "u1", {"name": "main"})
    termination.create_message_file(tmp_path, "u2", {"name": "main"})
    (tmp_path / "pods" / "u2" / "volumes").mkdir()
    termination.remove_pod_files(tmp_path, "u1")
    termination.remove_pod_files(tmp_path, "u2")
    termination.remove_pod_files(tmp_path, "never-existed")
    assert not (tmp_path / "pods" / "u1").exists()
    assert sorted(p.name for p in (tmp_path / "pods" / "u2").iterdir()) == ["volumes"]


def test_with_message_keeps_other_fields(tmp_path: Path) -> None:
    host = tmp_path / "msg"
    host.write_text("done")
    status = exited(mounts=(Mount("/dev/termination-log", str(host)),), exit_code=3)
    assert termination.with_message(status) == dataclasses.replace(status, message="done")

"""Port files (klet.portfiles): a replica publishes `<run-dir>/ports/<service>/
<hostname>-<pid>-<token>.json` (0700 directories, 0644 file) and its private file with the
same record, both replaced atomically by rename; withdrawing removes both; readers list
live replicas only — a file no live process holds locked (a crashed or SIGKILLed
replica's, a planted one) is skipped and removed, a malformed one skipped — and records
that are not port records are refused."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.portfiles import PortFiles, PortRecord, live_replicas, read_port_file


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def files(tmp_path: Path) -> Iterator[PortFiles]:
    replica = PortFiles(
        "eviction",
        run_dir=tmp_path / "run",
        private_file=tmp_path / "own" / "port.json",
        hostname="node-a",
        pid=4242,
        token="t0",
    )
    (tmp_path / "own").mkdir()
    yield replica
    replica.withdraw()


def test_publish_writes_both_files_with_one_record(files: PortFiles, tmp_path: Path) -> None:
    record = files.publish("127.0.0.1", 40123)
    assert record == PortRecord("eviction", "127.0.0.1", 40123, 4242, "node-a")
    published = tmp_path / "run" / "ports" / "eviction" / "node-a-4242-t0.json"
    assert files.published == published
    assert read_port_file(published) == record
    assert read_port_file(tmp_path / "own" / "port.json") == record
    assert live_replicas(tmp_path / "run", "eviction") == [record]
    assert live_replicas(tmp_path / "run", "syncloop") == []


def test_replicas_with_one_hostname_and_pid_publish_apart(tmp_path: Path) -> None:
    # Containers on the host's network in PID namespaces of their own: same hostname,
    # all pid 1. Each replica's file is its own.
    a = PortFiles("eviction", run_dir=tmp_path / "run", hostname="node-a", pid=1)
    b = PortFiles("eviction", run_dir=tmp_path / "run", hostname="node-a", pid=1)
    try:
        a.publish("127.0.0.1", 40001)
        b.publish("127.0.0.1", 40002)
        ports = sorted(r.port for r in live_replicas(tmp_path / "run", "eviction"))
        assert ports == [40001, 40002]
    finally:
        a.withdraw()
        b.withdraw()


def test_modes(files: PortFiles, tmp_path: Path) -> None:
    old = os.umask(0o077)  # a strict umask must not hide the file from readers
    try:
        files.publish("127.0.0.1", 40123)
    finally:
        os.umask(old)
    assert mode(tmp_path / "run" / "ports") == 0o700
    assert mode(tmp_path / "run" / "ports" / "eviction") == 0o700
    assert files.published is not None and mode(files.published) == 0o644
    assert mode(tmp_path / "own" / "port.json") == 0o644


def test_files_are_replaced_atomically(files: PortFiles, tmp_path: Path) -> None:
    files.publish("127.0.0.1", 40123)
    private = tmp_path / "own" / "port.json"
    assert files.published is not None
    with open(private) as old_private, open(files.published) as old_published:
        files.publish("127.0.0.1", 40124)
        # Renamed over, not rewritten in place: a reader of the old file saw it whole.
        assert PortRecord.from_json(old_private.read()).port == 40123
        assert PortRecord.from_json(old_published.read()).port == 40123
    assert read_port_file(private).port == 40124
    assert [r.port for r in live_replicas(tmp_path / "run", "eviction")] == [40124]
    leftovers = [p.name for p in (tmp_path / "own").iterdir()]
    leftovers += [p.name for p in files.published.parent.iterdir()]
    assert sorted(leftovers) == ["node-a-4242-t0.json", "port.json"]  # no temporary files


def test_withdraw_removes_both(files: PortFiles, tmp_path: Path) -> None:
    files.publish("::", 40123)
    files.withdraw()
    assert not (tmp_path / "own" / "port.json").exists()
    assert files.published is not None and not files.published.exists()
    assert live_replicas(tmp_path / "run", "eviction") == []
    files.withdraw()  # twice is harmless


def test_clear_private_removes_a_stale_file(files: PortFiles, tmp_path: Path) -> None:
    stale = tmp_path / "own" / "port.json"
    stale.write_text(PortRecord("eviction", "127.0.0.1", 1234, 1, "old").to_json())
    files.clear_private()
    assert not stale.exists()
    files.clear_private()  # none: nothing to do


def test_no_run_dir_publishes_only_the_private_file(tmp_path: Path) -> None:
    replica = PortFiles("syncloop", run_dir=None, private_file=tmp_path / "p.json")
    record = replica.publish("127.0.0.1", 40000)
    assert replica.published is None
    assert read_port_file(tmp_path / "p.json") == record
    assert record.pid == os.getpid()
    replica.withdraw()


def test_an_unwritable_run_dir_is_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("a file where the run directory should be")
    replica = PortFiles("syncloop", run_dir=tmp_path / "run", private_file=tmp_path / "p.json")
    replica.publish("127.0.0.1", 40000)  # logged, not raised
    assert read_port_file(tmp_path / "p.json").port == 40000
    assert live_replicas(tmp_path / "run", "syncloop") == []
    replica.withdraw()


def test_an_unwritable_private_file_is_an_error(tmp_path: Path) -> None:
    replica = PortFiles("syncloop", run_dir=None, private_file=tmp_path / "no" / "p.json")
    with pytest.raises(FileNotFoundError):
        replica.publish("127.0.0.1", 40000)


def test_a_file_nobody_holds_is_a_dead_replica(files: PortFiles, tmp_path: Path) -> None:
    files.publish("127.0.0.1", 40123)
    planted = tmp_path / "run" / "ports" / "eviction" / "node-b-7.json"
    planted.write_text(PortRecord("eviction", "127.0.0.1", 40999, 7, "node-b").to_json())
    assert [r.port for r in live_replicas(tmp_path / "run", "eviction", remove_dead=False)] == [
        40123
    ]
    assert planted.exists()
    assert [r.port for r in live_replicas(tmp_path / "run", "eviction")] == [40123]
    assert not planted.exists()


_REPLICA = """
import sys
from pathlib import Path
from klet.portfiles import PortFiles
files = PortFiles("eviction", run_dir=Path(sys.argv[1]))
files.publish("127.0.0.1", int(sys.argv[2]))
print("published", flush=True)
sys.stdin.read()  # until the test kills it
"""


def test_a_killed_replica_is_skipped_and_its_file_removed(files: PortFiles, tmp_path: Path) -> None:
    files.publish("127.0.0.1", 40123)
    child = subprocess.Popen(
        [sys.executable, "-c", _REPLICA, str(tmp_path / "run"), "40555"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "published\n"
        live = live_replicas(tmp_path / "run", "eviction")
        assert sorted((r.port, r.pid) for r in live) == [(40123, 4242), (40555, child.pid)]
    finally:
        child.send_signal(signal.SIGKILL)  # no clean exit: its file stays behind
        child.wait(10)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.stdout.close()
    left = list((tmp_path / "run" / "ports" / "eviction").glob(f"*-{child.pid}-*.json"))
    assert len(left) == 1
    assert [r.port for r in live_replicas(tmp_path / "run", "eviction")] == [40123]
    assert not left[0].exists()


def test_a_live_but_malformed_file_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "ports" / "eviction"
    directory.mkdir(parents=True)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
            "os.write(fd, b'{not json'); fcntl.flock(fd, fcntl.LOCK_EX);"
            "print('locked', flush=True); sys.stdin.read()",
            str(directory / "x-1.json"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        assert live_replicas(tmp_path / "run", "eviction") == []
        assert (directory / "x-1.json").exists()  # its writer is alive: kept
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.wait(10)
        child.stdout.close()


def test_no_directory_no_replicas(tmp_path: Path) -> None:
    assert live_replicas(tmp_path / "nothing", "eviction") == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"service": "x", "host": "h", "port": "80", "pid": 1, "hostname": "n"}', "port"),
        ('{"service": "x", "host": "h", "port": 0, "pid": 1, "hostname": "n"}', "out of range"),
        ('{"service": "x", "host": "h", "port": 70000, "pid": 1, "hostname": "n"}', "range"),
        ('{"service": "x", "host": "h", "port": true, "pid": 1, "hostname": "n"}', "port"),
        ('{"service": "x", "port": 80, "pid": 1, "hostname": "n"}', "host"),
    ],
)
def test_records_are_checked(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        PortRecord.from_json(text)


def test_record_round_trip() -> None:
    record = PortRecord("image-gc", "::", 40001, 12, "node-a")
    assert PortRecord.from_json(record.to_json()) == record

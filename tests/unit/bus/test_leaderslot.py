"""The leader slot file (`klet.bus.leaderslot.FileLeaderSlot`) on real files: a claim
locks it and names the holder; a probe sees it locked while any process holds it (a
probe of its own never blocks other probes, but does make a claim wait) and free, with
the holder's ID, once that process released it or died; garbage is never taken for an
ID; an unusable path raises instead of pretending."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from klet.bus.leaderslot import FileLeaderSlot, SlotView, read_holder

A = "host-a:10:aaaaaaaaaaaa"
B = "host-b:11:bbbbbbbbbbbb"


def slot_path(tmp_path: Path) -> Path:
    return tmp_path / "leases" / "syncloop.leader"


def test_a_claimed_slot_is_locked_and_names_its_holder(tmp_path: Path) -> None:
    path = slot_path(tmp_path)
    a, b = FileLeaderSlot(path, A), FileLeaderSlot(path, B)
    assert b.probe() is None  # no file yet: nothing to learn
    assert a.claim() and a.held
    assert path.read_text() == f"{A}\n"
    assert path.stat().st_mode & 0o777 == 0o600
    # Another open file description conflicts even within one process, as another
    # replica's would.
    assert b.probe() == SlotView(locked=True, holder=None)
    assert not b.claim() and not b.held
    assert a.claim()  # claiming again is a no-op
    assert path.read_text() == f"{A}\n"


def test_a_released_slot_is_free_and_still_names_its_last_holder(tmp_path: Path) -> None:
    path = slot_path(tmp_path)
    a, b = FileLeaderSlot(path, A), FileLeaderSlot(path, B)
    assert a.claim()
    a.release()
    assert not a.held
    assert b.probe() == SlotView(locked=False, holder=A)
    assert b.claim()
    assert path.read_text() == f"{B}\n"  # a shorter or longer ID leaves no tail behind
    assert a.probe() == SlotView(locked=True, holder=None)
    a.release()  # not held: nothing happens
    assert b.held


def test_probes_share_the_lock_but_a_claim_waits_for_them(tmp_path: Path) -> None:
    path = slot_path(tmp_path)
    a, b = FileLeaderSlot(path, A), FileLeaderSlot(path, B)
    assert a.claim()
    a.release()
    probing = os.open(path, os.O_RDONLY)  # another standby's probe, caught mid-way
    try:
        fcntl.flock(probing, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert b.probe() == SlotView(locked=False, holder=A)
        assert not b.claim()
    finally:
        os.close(probing)
    assert b.claim()


def test_a_slot_is_free_once_its_process_is_killed(tmp_path: Path) -> None:
    path = slot_path(tmp_path)
    script = (
        "import sys; from pathlib import Path; from klet.bus.leaderslot import FileLeaderSlot; "
        "s = FileLeaderSlot(Path(sys.argv[1]), sys.argv[2]); assert s.claim(); "
        "print('claimed', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path), A],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "claimed\n"
        me = FileLeaderSlot(path, B)
        assert me.probe() == SlotView(locked=True, holder=None)
        child.send_signal(signal.SIGSTOP)  # stopped is not dead
        assert me.probe() == SlotView(locked=True, holder=None)
        child.kill()
        child.wait(timeout=10)
        assert me.probe() == SlotView(locked=False, holder=A)
    finally:
        child.kill()
        child.wait(timeout=10)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.stdout.close()


@pytest.mark.parametrize(
    ("raw", "holder"),
    [
        (f"{A}\n".encode(), A),
        (f"{A}\n{B}\n".encode(), A),  # died between writing its ID and cutting the file
        (b"", None),
        (b"host-a:10:aaaa\n", None),  # a prefix of an ID would match other holders
        (b"../../etc:1:zz\n", None),
        (b"\xff\xfe garbage", None),
    ],
)
def test_only_a_complete_id_is_read(raw: bytes, holder: str | None) -> None:
    assert read_holder(raw) == holder


def test_an_unusable_slot_raises(tmp_path: Path) -> None:
    (tmp_path / "leases").write_text("not a directory")
    with pytest.raises(OSError):
        FileLeaderSlot(slot_path(tmp_path), A).claim()
    other = tmp_path / "other"
    (other / "leases").mkdir(parents=True)
    (other / "target").write_text(f"{B}\n")
    slot_path(other).symlink_to(other / "target")  # never followed
    with pytest.raises(OSError):
        FileLeaderSlot(slot_path(other), A).claim()
    with pytest.raises(OSError):
        FileLeaderSlot(slot_path(other), A).probe()

"""Lease holder identities (`klet.bus.holder`): unique per process, and a replica slot
(a locked file in the run directory) that names a dead predecessor only when its
process is gone, and a service's lease comes with its leader slot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from klet.bus.holder import claim_slot, new_holder_id, service_lease
from klet.bus.leaderslot import FileLeaderSlot
from klet.testbed.fakes.bus import FakeBus


def test_ids_are_unique_and_name_the_process() -> None:
    ids = {new_holder_id() for _ in range(100)}
    assert len(ids) == 100
    host, pid, rand = next(iter(ids)).split(":")
    assert host and int(pid) == os.getpid() and len(rand) == 12


def test_two_live_replicas_in_one_run_dir_never_share_an_identity(tmp_path: Path) -> None:
    first = claim_slot(tmp_path, "syncloop")
    second = claim_slot(tmp_path, "syncloop")  # the slot is locked by `first`
    assert first.holder != second.holder
    assert second.predecessor is None
    assert (tmp_path / "leases" / "syncloop" / "holder").read_text().strip() == first.holder
    assert (tmp_path / "leases" / "syncloop" / "holder").stat().st_mode & 0o777 == 0o600


def test_a_dead_process_of_the_slot_is_named_as_predecessor(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; from klet.bus.holder import claim_slot; "
        "print(claim_slot(Path(sys.argv[1]), 'image-gc').holder)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], check=True, capture_output=True, text=True
    )
    dead = done.stdout.strip()
    me = claim_slot(tmp_path, "image-gc")
    assert me.predecessor == dead and me.holder != dead
    assert claim_slot(tmp_path, "eviction").predecessor is None  # another service's slot


def test_an_unusable_slot_means_no_predecessor(tmp_path: Path) -> None:
    (tmp_path / "leases").write_text("not a directory")
    me = claim_slot(tmp_path, "syncloop")
    assert me.predecessor is None and me.holder
    garbage = tmp_path / "other"
    (garbage / "leases" / "syncloop").mkdir(parents=True)
    (garbage / "leases" / "syncloop" / "holder").write_text("../../etc:1:zz\n")
    assert claim_slot(garbage, "syncloop").predecessor is None


def test_a_service_lease_comes_with_this_hosts_leader_slot(tmp_path: Path) -> None:
    lease = service_lease(FakeBus("n1"), "eviction", tmp_path, ttl_ms=15_000)
    slot = lease.leader_slot
    assert isinstance(slot, FileLeaderSlot)
    assert slot.path == tmp_path / "leases" / "eviction" / "leader"
    assert slot.holder == lease.holder and not slot.held


def test_each_services_slots_are_in_its_own_directory(tmp_path: Path) -> None:
    """Both slots of a service are in `leases/<service>/`, the directory a deployment
    mounts for that service alone: nothing of one service's lands in leases/ itself or
    in another service's directory."""
    for service in ("eviction", "image-gc"):
        slot = service_lease(FakeBus("n1"), service, tmp_path, ttl_ms=15_000).leader_slot
        assert isinstance(slot, FileLeaderSlot) and slot.claim()
        slot.release()
    assert {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")} == {
        "leases",
        "leases/eviction",
        "leases/eviction/holder",
        "leases/eviction/leader",
        "leases/image-gc",
        "leases/image-gc/holder",
        "leases/image-gc/leader",
    }

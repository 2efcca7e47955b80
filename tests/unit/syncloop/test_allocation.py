"""The allocation checkpoint (pods/allocation.py): written through on change and read
back by a new process, missing means empty, a corrupt or tampered file is reported
naming the file and cause and counts as empty, orphans are forgotten."""

from __future__ import annotations

import json
from pathlib import Path

from klet.syncloop.pods.allocation import ALLOCATED_FILE, Checkpoint

RES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}}


def test_round_trip_through_a_new_process(tmp_path: Path) -> None:
    path = tmp_path / ALLOCATED_FILE
    cp, problem = Checkpoint.load(path)
    assert problem is None and cp.pods == {}
    cp.put("u1", {"main": RES})
    cp.put("u2", {"a": {}, "b": RES})
    again, problem = Checkpoint.load(path)
    assert problem is None
    assert again.get("u1") == {"main": RES} and again.get("u2") == {"a": {}, "b": RES}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not path.with_name(path.name + ".tmp").exists()


def test_unchanged_set_does_not_rewrite(tmp_path: Path) -> None:
    path = tmp_path / ALLOCATED_FILE
    cp, _ = Checkpoint.load(path)
    cp.put("u1", {"main": RES})
    path.write_text("marker")  # a rewrite would replace it
    cp.put("u1", {"main": dict(RES)})
    assert path.read_text() == "marker"
    cp.put("u1", {"main": {}})
    assert Checkpoint.load(path)[0].get("u1") == {"main": {}}


def test_corrupt_and_tampered_files_count_as_empty(tmp_path: Path) -> None:
    path = tmp_path / ALLOCATED_FILE
    path.write_text("{not json")
    cp, problem = Checkpoint.load(path)
    assert cp.pods == {} and problem is not None
    assert str(path) in str(problem) and "not JSON" in str(problem)

    good, _ = Checkpoint.load(path)
    good.put("u1", {"main": RES})
    doc = json.loads(path.read_text())
    doc["pods"]["u1"]["main"]["requests"]["cpu"] = "4"
    path.write_text(json.dumps(doc))
    cp, problem = Checkpoint.load(path)
    assert cp.pods == {} and problem is not None and "sha256" in str(problem)

    path.write_text(json.dumps({"version": 7, "pods": {}}))
    _, problem = Checkpoint.load(path)
    assert problem is not None and "version" in str(problem)


def test_orphans_are_forgotten(tmp_path: Path) -> None:
    path = tmp_path / ALLOCATED_FILE
    cp, _ = Checkpoint.load(path)
    cp.put("u1", {"main": RES})
    cp.put("u2", {"main": RES})
    cp.keep_only({"u2"})
    cp.remove("u3")  # unknown: nothing to do
    again, _ = Checkpoint.load(path)
    assert set(again.pods) == {"u2"}

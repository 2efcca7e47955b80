"""syncloop checks every desired record before acting on it.

A record that fails the shared pod validation (a volume named `../../..`, a UID that is
a path) is refused: logged with the pod and field, a FailedValidation Warning when its
identity allows one, never started, and a running pod whose record turns invalid is
stopped like a removed one; a record naming another node is ignored. The other pods of
the table run either way. Also: the path joins themselves refuse unsafe components.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from klet.model.podvalidation import UnsafePathComponent
from klet.model.records import DesiredPod, PodChange
from klet.model.types import PodUID
from klet.syncloop.containers import termination
from klet.syncloop.environment import etchosts
from klet.syncloop.model import podspec
from klet.syncloop.pods.controller import FAILED_VALIDATION, check_desired
from klet.syncloop.volumes.base import volume_path
from klet.syncloop.volumes.manager import VolumeManager

from .helpers import pod
from .test_controller import READY, World

NODE = "node1"


def rec(uid: str, p: dict[str, Any] | None = None, *, hash_: str = "h1") -> DesiredPod:
    return DesiredPod(
        uid=PodUID(uid), pod=p or pod("app", uid=uid), source="file", hash=hash_, seen_at=0.0
    )


def escaping_volume(uid: str) -> dict[str, Any]:
    return pod("app", uid=uid, volumes=[{"name": "../../..", "emptyDir": {}}])


@pytest.fixture
def w(tmp_path: Path) -> World:
    world = World(tmp_path)
    assert world.controller.node_name == NODE
    return world


def test_a_valid_record_passes() -> None:
    assert check_desired("u1", rec("u1"), node_name=NODE) is None
    assert (
        check_desired("u1", rec("u1", pod("app", uid="u1", nodeName=NODE)), node_name=NODE) is None
    )


@pytest.mark.parametrize(
    ("uid", "p", "field"),
    [
        ("u1", escaping_volume("u1"), "spec.volumes[0].name"),
        ("../x", pod("app", uid="../x"), "metadata.uid"),
        ("u1", pod("app", uid="u2"), "metadata.uid"),  # not the table key
        ("u1", {"metadata": "x"}, "metadata"),
    ],
)
def test_invalid_records_are_refused_naming_the_field(uid: str, p: Any, field: str) -> None:
    refusal = check_desired(uid, rec(uid, p), node_name=NODE)
    assert refusal is not None and refusal.reason == FAILED_VALIDATION
    assert f"{field}: " in refusal.message


def test_another_nodes_record_is_refused() -> None:
    refusal = check_desired("u1", rec("u1", pod("app", uid="u1", nodeName="node2")), node_name=NODE)
    assert refusal is not None and refusal.reason == "OtherNode"
    assert "node2" in refusal.message


async def test_an_invalid_record_is_not_run_and_the_others_are(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    table = {"good": rec("good"), "bad": rec("bad", escaping_volume("bad"))}
    with caplog.at_level(logging.ERROR, logger="klet.syncloop.pods.controller"):
        w.controller.apply_desired(table, READY, read_from=0)
        w.controller.apply_desired(table, READY, read_from=0)  # a resync logs nothing new
    assert set(w.controller.desired) == {"good"}
    for uid in table:
        await w.controller.sync_once(uid)
    assert w.running() == ["good"]
    [record] = [r for r in caplog.records if "invalid" in r.getMessage()]
    assert "default/web-node1" in record.getMessage()
    assert "spec.volumes[0].name" in record.getMessage()
    events = w.events.of(FAILED_VALIDATION)
    assert len(events) == 1 and events[0].type == "Warning"
    assert "spec.volumes[0].name" in events[0].message


async def test_a_record_with_an_unsafe_uid_gets_no_event(w: World) -> None:
    w.controller.apply_desired({"../x": rec("../x", pod("app", uid="../x"))}, READY, read_from=0)
    assert w.controller.desired == {}
    assert w.events.of(FAILED_VALIDATION) == []


async def test_another_nodes_record_is_ignored(w: World, caplog: pytest.LogCaptureFixture) -> None:
    other = rec("o", pod("app", uid="o", nodeName="node2"))
    with caplog.at_level(logging.ERROR, logger="klet.syncloop.pods.controller"):
        w.controller.apply_desired({"o": other, "good": rec("good")}, READY, read_from=0)
    for uid in ("o", "good"):
        await w.controller.sync_once(uid)
    assert w.running() == ["good"]
    assert w.controller.publisher.get("o") is None  # no status for another node's pod
    assert any("another node" in r.getMessage() for r in caplog.records)
    assert w.events.reasons() == ["Pulled", "Created", "Started"]  # the good pod's only


async def test_a_running_pod_whose_record_turns_invalid_is_stopped(w: World) -> None:
    w.controller.apply_desired({"u1": rec("u1")}, READY, read_from=0)
    await w.controller.sync_once("u1")
    assert w.running() == ["u1"]
    w.bus.seed(w.deps.node_bus.desired, "u1", rec("u1", escaping_volume("u1"), hash_="h2"))
    await w.controller.on_change(PodChange(op="UPDATE", uid=PodUID("u1"), source="file"))
    w.controller.sources_ready = True
    await w.controller.sync_once("u1")
    assert w.running() == []


def test_volume_paths_refuse_unsafe_names(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathComponent):
        volume_path(tmp_path, dir_name="kubernetes.io~empty-dir", name="../../..")
    assert volume_path(tmp_path, dir_name="kubernetes.io~empty-dir", name="data") == (
        tmp_path / "volumes" / "kubernetes.io~empty-dir" / "data"
    )


def test_pod_directories_refuse_unsafe_uids(tmp_path: Path) -> None:
    manager = VolumeManager([], root_dir=tmp_path, node=None)  # type: ignore[arg-type]
    for uid in ("..", "../etc", "a/b", ""):
        with pytest.raises(UnsafePathComponent):
            manager.pod_dir(uid)
        with pytest.raises(UnsafePathComponent):
            termination.containers_dir(tmp_path, uid)
        with pytest.raises(UnsafePathComponent):
            etchosts.hosts_path(tmp_path, uid)
    with pytest.raises(UnsafePathComponent):
        podspec.pod_log_dir_name({"metadata": {"namespace": "a", "name": "b", "uid": "c/../../d"}})


def test_removal_with_an_unsafe_runtime_uid_touches_nothing(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "containers").mkdir(parents=True)
    root = tmp_path / "root"
    (root / "pods").mkdir(parents=True)
    termination.remove_pod_files(root, "../../victim")
    etchosts.remove_hosts_file(root, "../../victim")
    assert (victim / "containers").is_dir()

"""Where syncloop observes the upstream pod metrics, through production wiring over the
fake runtime: kubelet_pod_worker_duration_seconds by operation_type (create, sync,
update, kill, terminated), kubelet_started_pods_total / _errors_total,
kubelet_started_containers_total / _errors_total by container_type and code,
kubelet_image_pull_duration_seconds by image size, kubelet_pod_start_duration_seconds,
kubelet_pod_start_sli_duration_seconds and kubelet_pod_start_total_duration_seconds once
per pod that starts, kubelet_pod_worker_start_duration_seconds at its first sync (from
when it was seen, or from the process's start) with kubelet_containers_per_pod_count,
kubelet_restarted_pods_total{static} when a pod is desired again while its worker
removes it, kubelet_orphaned_runtime_pods_total when a restarted syncloop kills a pod no
source wants, kubelet_working_pods by lifecycle, config and static as the controller
reports its pods; and the pure parts: the operation type, a worker's (lifecycle,
config, static), the image size buckets, the start tracker's arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.cri import CRIError
from klet.model.pod import CONFIG_SEEN, CONFIG_SOURCE
from klet.model.records import DesiredPod, SourceState
from klet.model.timestamps import rfc3339
from klet.model.types import PodUID
from klet.syncloop.metrics import image_size_bucket
from klet.syncloop.pods.podstate import (
    KillRequest,
    PodSyncState,
    pod_worker_operation,
    working_pod,
    working_pod_counts,
)
from klet.testbed.fakes.cri import FakeRuntimeService
from prometheus_client import CollectorRegistry, Histogram

from .helpers import Clock, RecordedEvents, pod, wire

READY = {"file": SourceState(source="file", ready=True, at=0.0)}
NOW = 1_700_000_000.0


class NoWorkers:
    def wake(self, uid: str) -> None:
        return None

    def uids(self) -> list[str]:
        return []


def desired(uid: str = "u1", hash: str = "h1", **meta: Any) -> DesiredPod:
    p = pod("app", uid=uid)
    p["metadata"].update(meta)
    return DesiredPod(uid=PodUID(uid), pod=p, source="file", hash=hash, seen_at=0.0)


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock(NOW)
        self.cri = FakeRuntimeService(clock=self.clock.ns)
        self.deps = wire(tmp_path, self.cri, events=RecordedEvents(), clock=self.clock)
        self.controller = self.deps.controller
        self.controller.workers = NoWorkers()  # type: ignore[assignment]
        self.registry: CollectorRegistry = self.deps.registry

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def want(self, rec: DesiredPod) -> None:
        self.controller.apply_desired(
            {str(rec.uid): rec}, READY, read_from=self.controller.generation
        )


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


WORKER = "kubelet_pod_worker_duration_seconds_count"


async def test_a_pod_start_is_observed_at_each_point(w: World) -> None:
    created, seen = NOW - 10, NOW - 4
    w.want(desired(creationTimestamp=rfc3339(created), annotations={CONFIG_SEEN: rfc3339(seen)}))
    await w.controller.sync_once("u1")
    assert w.controller.publisher.get("u1")["phase"] == "Running"  # type: ignore[index]
    assert w.value(WORKER, operation_type="create") == 1
    assert w.value("kubelet_started_pods_total") == 1
    assert w.value("kubelet_started_pods_errors_total") == 0
    assert w.value("kubelet_started_containers_total", container_type="container") == 1
    # the image was not there: pulled once (the fake's images have no size: "N/A")
    assert w.value("kubelet_image_pull_duration_seconds_count", image_size_in_bytes="N/A") == 1
    assert w.value("kubelet_pod_start_duration_seconds_count") == 1
    assert w.value("kubelet_pod_start_duration_seconds_sum") == pytest.approx(4)
    assert w.value("kubelet_pod_start_sli_duration_seconds_count") == 1
    assert w.value("kubelet_pod_start_sli_duration_seconds_sum") == pytest.approx(10)
    # the worker started 4 s after the pod was seen (all before this process began: 0)
    assert w.value("kubelet_pod_worker_start_duration_seconds_count") == 1
    assert w.value("kubelet_pod_worker_start_duration_seconds_sum") == pytest.approx(0)
    # the fake pulls in no time: the total is the SLI here
    assert w.value("kubelet_pod_start_total_duration_seconds_count") == 1
    assert w.value("kubelet_pod_start_total_duration_seconds_sum") == pytest.approx(10)

    await w.controller.sync_once("u1")  # nothing changed: a sync, and no second start
    assert w.value(WORKER, operation_type="sync") == 1
    assert w.value("kubelet_pod_start_duration_seconds_count") == 1
    assert w.value("kubelet_started_pods_total") == 1

    w.want(desired(hash="h2", labels={"new": "label"}))
    await w.controller.sync_once("u1")
    assert w.value(WORKER, operation_type="update") == 1

    w.controller.apply_desired({}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u1")
    assert w.value(WORKER, operation_type="terminated") == 1


async def test_failed_starts_are_counted_with_their_code(w: World) -> None:
    w.cri.fail_next("RunPodSandbox", CRIError("no network", code="UNKNOWN"))
    w.want(desired())
    await w.controller.sync_once("u1")
    assert w.value("kubelet_started_pods_total") == 1
    assert w.value("kubelet_started_pods_errors_total") == 1
    assert w.value("kubelet_pod_start_duration_seconds_count") == 0

    w.cri.fail_next("StartContainer", CRIError("exec format error", code="UNKNOWN"))
    await w.controller.sync_once("u1")
    assert w.value("kubelet_started_pods_total") == 2
    assert w.value("kubelet_started_containers_total", container_type="container") == 1
    assert (
        w.value(
            "kubelet_started_containers_errors_total",
            container_type="container",
            code="RunContainerError",
        )
        == 1
    )


async def test_a_pod_running_before_this_process_saw_it_is_not_a_start(w: World) -> None:
    w.want(desired())
    await w.controller.sync_once("u1")
    # a new syncloop (a restart) finds it running: no start to observe
    other = World.__new__(World)
    other.clock, other.cri = w.clock, w.cri
    other.deps = wire(
        Path(w.deps.settings.klet.root_dir).parent / "again",
        w.cri,
        events=RecordedEvents(),
        clock=w.clock,
    )
    other.controller = other.deps.controller
    other.controller.workers = NoWorkers()  # type: ignore[assignment]
    other.registry = other.deps.registry
    other.want(desired())
    await other.controller.sync_once("u1")
    assert other.value(WORKER, operation_type="create") == 1
    assert other.value("kubelet_pod_start_duration_seconds_count") == 0


def test_pod_worker_operation() -> None:
    rec = desired()
    assert pod_worker_operation(None) == "terminated"
    assert pod_worker_operation(PodSyncState()) == "terminated"
    state = PodSyncState(desired=rec)
    assert pod_worker_operation(state) == "create"
    state.synced, state.synced_once = rec, True
    assert pod_worker_operation(state) == "sync"
    state.desired = desired(hash="h2")
    assert pod_worker_operation(state) == "update"
    state.terminal = ("Evicted", "out of memory")
    assert pod_worker_operation(state) == "kill"
    deleting = PodSyncState(desired=desired(deletionTimestamp=rfc3339(NOW)), synced_once=True)
    assert pod_worker_operation(deleting) == "kill"


MIB, GIB = 1024 * 1024, 1024 * 1024 * 1024


@pytest.mark.parametrize(
    ("size", "label"),
    [
        (0, "N/A"),
        (1, "0-10MB"),
        (10 * MIB, "0-10MB"),
        (10 * MIB + 1, "10MB-100MB"),
        (300 * MIB, "100MB-500MB"),
        (GIB, "500MB-1GB"),
        (2 * GIB, "1GB-5GB"),
        (50 * GIB, "40GB-60GB"),
        (100 * GIB + 1, "GT100GB"),
    ],
)
def test_image_size_bucket(size: int, label: str) -> None:
    assert image_size_bucket(size) == label


def status(phase: str, *running: bool, init: tuple[float, float] | None = None) -> dict[str, Any]:
    """A pod status: `phase`, one container status per `running` flag, and a completed
    init container that ran from init[0] to init[1]."""
    out: dict[str, Any] = {
        "phase": phase,
        "containerStatuses": [
            {"name": f"c{i}", "state": {"running": {}} if r else {"waiting": {}}}
            for i, r in enumerate(running)
        ],
    }
    if init is not None:
        began, ended = (rfc3339(t) for t in init)
        out["initContainerStatuses"] = [
            {"name": "init", "state": {"terminated": {"startedAt": began, "finishedAt": ended}}}
        ]
    return out


def test_the_start_tracker() -> None:
    from klet.syncloop.metrics import PodStartTracker

    registry = CollectorRegistry()
    tracker = PodStartTracker(
        start=Histogram("start", "s", registry=registry),
        sli=Histogram("sli", "s", registry=registry),
        total=Histogram("total", "s", registry=registry),
    )
    p = desired(creationTimestamp=rfc3339(NOW)).pod
    p["spec"]["containers"].append({"name": "second", "image": "x"})
    tracker.status("u1", p, status("Pending"), NOW + 1)
    tracker.pulling("u1", NOW + 2)
    tracker.pulled("u1", NOW + 5)
    tracker.pulling("u1", NOW + 4)  # overlapping the first: counted once
    tracker.pulled("u1", NOW + 6)
    tracker.pulling("u1", NOW + 8)  # failed: never finished, replaced by the next
    tracker.pulling("u1", NOW + 9)
    tracker.pulled("u1", NOW + 10)
    # Running with one of its two containers: the start, not yet the SLI
    tracker.status("u1", p, status("Running", True, False, init=(NOW + 6, NOW + 8)), NOW + 20)
    assert registry.get_sample_value("start_count") == 1
    # no config.seen annotation: from the first sync that saw it pending
    assert registry.get_sample_value("start_sum") == pytest.approx(19)
    assert registry.get_sample_value("sli_count") == 0
    tracker.status("u1", p, status("Running", True, True, init=(NOW + 6, NOW + 8)), NOW + 30)
    tracker.status("u1", p, status("Running", True, True), NOW + 40)  # once
    assert registry.get_sample_value("start_count") == 1
    assert registry.get_sample_value("sli_count") == 1
    # 30 s since creation, less 4 s of pulls (2-6) and 1 s (9-10), less 2 s of init
    assert registry.get_sample_value("sli_sum") == pytest.approx(30 - 5 - 2)
    # the total leaves nothing out, observed at the same moment
    assert registry.get_sample_value("total_count") == 1
    assert registry.get_sample_value("total_sum") == pytest.approx(30)

    # a pod that ends before it runs is not a start
    tracker.status("u2", p, status("Pending"), NOW)
    tracker.status("u2", p, status("Failed"), NOW + 1)
    tracker.status("u2", p, status("Running", True, True), NOW + 2)
    assert registry.get_sample_value("start_count") == 1

    # a new life of the same UID once the old one was forgotten
    tracker.forget("u1")
    tracker.status("u1", p, status("Pending"), NOW + 50)
    tracker.status("u1", p, status("Running", True, True), NOW + 51)
    assert registry.get_sample_value("start_count") == 2
    assert registry.get_sample_value("sli_count") == 2
    assert registry.get_sample_value("total_count") == 2
    assert registry.get_sample_value("total_sum") == pytest.approx(30 + 51)


async def test_the_pod_cgroup_creation_is_timed(tmp_path: Path) -> None:
    from klet.cgroups import CgroupFS
    from klet.syncloop.containers.podcgroups import CgroupfsPodCgroups, pod_cgroup_exists
    from klet.syncloop.containers.syncsettings import SyncSettings

    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")  # a v2 hierarchy
    clock = Clock(NOW)
    cri = FakeRuntimeService(clock=clock.ns)
    deps = wire(
        tmp_path,
        cri,
        events=RecordedEvents(),
        clock=clock,
        sync=SyncSettings(pod_logs_dir=tmp_path, cgroups_per_qos=True),
    )
    deps.controller.syncer.cgroups = CgroupfsPodCgroups(CgroupFS(root))
    deps.controller.workers = NoWorkers()  # type: ignore[assignment]
    rec = desired()
    deps.controller.apply_desired({"u1": rec}, READY, read_from=deps.controller.generation)
    await deps.controller.sync_once("u1")
    name = "kubelet_cgroup_manager_duration_seconds_count"
    assert deps.registry.get_sample_value(name, {"operation_type": "create"}) == 1
    assert deps.registry.get_sample_value(name, {"operation_type": "update"}) is None
    parent = deps.controller.syncer._cgroup_parent(rec.pod)
    assert pod_cgroup_exists(parent, root=root)
    assert not pod_cgroup_exists(parent + "-other", root=root)


async def test_the_worker_start_counts_from_the_sighting_or_the_process_start(
    w: World,
) -> None:
    w.clock.t = NOW + 10  # the process began at NOW (the wiring's clock)
    records = [
        desired(uid="u1", annotations={CONFIG_SEEN: rfc3339(NOW + 7)}),
        desired(uid="u2", annotations={CONFIG_SEEN: rfc3339(NOW - 3600)}),
        desired(uid="u3"),  # not stamped by its source: not observed
    ]
    w.controller.apply_desired(
        {str(r.uid): r for r in records}, READY, read_from=w.controller.generation
    )
    for uid in ("u1", "u2", "u3"):
        await w.controller.sync_once(uid)
    await w.controller.sync_once("u1")  # not its create: not observed again
    assert w.value("kubelet_pod_worker_start_duration_seconds_count") == 2
    # 3 s for u1; u2 was seen an hour before this process began: 10 s from its start
    assert w.value("kubelet_pod_worker_start_duration_seconds_sum") == pytest.approx(13)
    # each pod's first sync observed its one container, and only that sync
    assert w.value("kubelet_containers_per_pod_count_count") == 3
    assert w.value("kubelet_containers_per_pod_count_sum") == 3
    assert w.value("kubelet_containers_per_pod_count_bucket", le="1.0") == 3


async def test_a_pod_desired_again_while_it_is_removed_is_a_restart(w: World) -> None:
    static = desired(uid="s1", annotations={CONFIG_SOURCE: "file"})
    api = desired(uid="a1")
    both = {"s1": static, "a1": api}
    w.controller.apply_desired(both, READY, read_from=w.controller.generation)
    for uid in both:
        await w.controller.sync_once(uid)
    w.controller.apply_desired({}, READY, read_from=w.controller.generation)

    async def wanted_again() -> None:  # while the worker stops the sandbox
        w.controller.apply_desired(both, READY, read_from=w.controller.generation)

    w.cri.hooks["StopPodSandbox"] = wanted_again
    await w.controller.sync_once("s1")
    del w.cri.hooks["StopPodSandbox"]
    assert w.value("kubelet_restarted_pods_total", static="true") == 1
    assert w.value("kubelet_restarted_pods_total", static="") == 0
    assert w.controller.pods["s1"].desired is static  # a new life, synced anew
    w.controller.apply_desired({"s1": static}, READY, read_from=w.controller.generation)
    await w.controller.sync_once("a1")  # removed for good: not a restart
    assert "a1" not in w.controller.pods
    assert w.value("kubelet_restarted_pods_total", static="") == 0
    assert w.value("kubelet_orphaned_runtime_pods_total") == 0  # its spec was known


async def test_a_restarted_syncloop_counts_the_pods_no_source_wants(
    w: World, tmp_path: Path
) -> None:
    w.want(desired(uid="u1"))
    await w.controller.sync_once("u1")
    # syncloop restarts over the same runtime; the pod was deleted meanwhile
    again = wire(tmp_path / "again", w.cri, events=RecordedEvents(), clock=w.clock)
    again.controller.workers = NoWorkers()  # type: ignore[assignment]
    again.controller.apply_desired({}, READY, read_from=again.controller.generation)
    w.cri.calls.clear()
    await again.controller.sync_once("u1")
    assert [c[0] for c in w.cri.calls if c[0] == "StopPodSandbox"] == ["StopPodSandbox"]
    assert again.registry.get_sample_value("kubelet_orphaned_runtime_pods_total") == 1
    assert w.value("kubelet_orphaned_runtime_pods_total") == 0


def test_a_workers_lifecycle_config_and_static() -> None:
    api = desired(uid="a")
    static = desired(uid="s", annotations={CONFIG_SOURCE: "file"})
    deleting = desired(uid="d", deletionTimestamp="2026-01-01T00:00:00Z")
    cases: list[tuple[PodSyncState | None, str | None, tuple[str, str, str]]] = [
        (None, None, ("terminating", "runtime_only", "unknown")),
        (PodSyncState(), None, ("terminating", "runtime_only", "unknown")),
        (PodSyncState(desired=api), "Running", ("sync", "desired", "")),
        (PodSyncState(desired=static), "Pending", ("sync", "desired", "true")),
        (PodSyncState(desired=api), "Succeeded", ("terminated", "desired", "")),
        (
            PodSyncState(desired=api, terminal=("Evicted", "x")),
            "Failed",
            ("terminating", "desired", ""),
        ),
        (PodSyncState(desired=deleting), "Running", ("terminating", "desired", "")),
        (PodSyncState(desired=deleting, released=True), "Running", ("terminated", "desired", "")),
        (PodSyncState(last_pod=static.pod), "Running", ("terminating", "orphan", "true")),
        (PodSyncState(last_pod=api.pod, released=True), None, ("terminated", "orphan", "")),
    ]
    for state, phase, want in cases:
        assert working_pod(state, phase) == want, (state, phase)
    counts = working_pod_counts({"a": (PodSyncState(desired=api), "Running"), "x": (None, None)})
    assert len(counts) == 15 and sum(counts.values()) == 2  # every valid series, zeros too
    assert counts[("sync", "desired", "")] == 1
    assert counts[("terminating", "runtime_only", "unknown")] == 1


async def test_working_pods_as_the_controller_reports_them(w: World) -> None:
    records = {"u1": desired(uid="u1"), "u2": desired(uid="u2")}
    w.controller.apply_desired(records, READY, read_from=w.controller.generation)
    await w.controller.sync_once("u1")
    w.controller.pods["u2"].kill = KillRequest(None, "Evicted", "x")
    w.deps.metrics.set_working_pods(w.controller.working_pods())

    def working(lifecycle: str, config: str, static: str) -> float:
        return w.value("kubelet_working_pods", lifecycle=lifecycle, config=config, static=static)

    assert working("sync", "desired", "") == 1
    assert working("terminating", "desired", "") == 1
    assert working("terminated", "orphan", "true") == 0  # a valid series, at 0
    w.controller.pods["u2"].kill = None
    w.deps.metrics.set_working_pods(w.controller.working_pods())
    assert working("sync", "desired", "") == 2
    assert working("terminating", "desired", "") == 0

"""The pod status manager against the fake apiserver, over the real pod view: statuses
sent once per change with the UID precondition and foreign conditions kept; refused
transitions never sent; deleted or recreated pods forgotten; finished pods deleted with
grace 0 after their final status; static pods mirrored (created, recreated when deleted
or stale, removed when the static pod goes, only once the sources are ready) with their
status on the mirror, and counted in kubelet_mirror_pods; an apiserver outage logged
once per pass and healed, the loop trying again after the minimum gap (not the
resync period) once the apiserver failed; the loop reacting to a view change; each
status the apiserver took timed from the first change it carries
(kubelet_pod_status_sync_duration_seconds);
a readiness change sent before unrelated queued statuses, also when it arrives mid-pass."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from klet.bus import NodeBus
from klet.model.records import DesiredPod, SourceState
from klet.model.types import JSON, PodUID
from klet.status_reporter.cluster.kubeapi import NO_RETRY, KubeApi
from klet.status_reporter.cluster.nodeid import NodeIdentity
from klet.status_reporter.cluster.podsync import PodSyncManager, PodSyncPolicy
from klet.status_reporter.metrics.instruments import Metrics
from klet.status_reporter.pods.podcache import CachePolicy, PodCache
from klet.testbed.fakes.bus import FakeBus
from klet.testbed.fakes.status_reporter import (
    FakeApiServer,
    desired_record,
    make_api_pod,
    make_static_pod,
    status_record,
)
from prometheus_client import CollectorRegistry

PODS = "/api/v1/namespaces/default/pods"


class World:
    def __init__(self, *, resync_s: float = 0.05) -> None:
        self.kube = FakeApiServer()
        self.bus = FakeBus()
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.now = 0.0  # wall-clock seconds (a record's updated_at is its version)
        node = NodeBus.of(self.bus, service="status-reporter")
        self.desired = node.desired
        self.status = node.status
        self.sources = node.sources
        self.cache = PodCache(
            desired=self.desired,
            status=self.status,
            feed=node.podstatus,
            metrics=self.metrics,
            policy=CachePolicy(read_block_ms=1),
        )
        self.identity = NodeIdentity("node1")
        self.identity.set_uid("node-uid")
        self.sync = PodSyncManager(
            view=self.cache,
            api=KubeApi(self.kube, retry=NO_RETRY),
            identity=self.identity,
            sources=self.sources,
            policy=PodSyncPolicy(resync_s=resync_s, min_resync_gap_s=0.01),
            on_mirrors=self.metrics.mirror_pods.set,
            on_synced=self.metrics.pod_status_sync.observe,
            wall=lambda: self.now,
        )

    def admin_creates(self, pod: JSON) -> JSON:
        """The pod as the apiserver holds it (admin created it), same UID."""
        return self.kube.put(f"{PODS}/{pod['metadata']['name']}", pod)

    async def want(self, pod: JSON, source: Any = "api") -> None:
        rec = desired_record(pod)
        record = DesiredPod(rec.uid, pod, source, rec.hash, rec.seen_at)
        self.bus.seed(self.desired, rec.uid, record)
        await self.cache.reload()

    async def report(self, pod: JSON, **kw: Any) -> None:
        record = status_record(pod, **kw)
        self.bus.seed(self.status, record.uid, record)
        await self.cache.refresh_pod(record.uid)

    def api(self, name: str) -> JSON | None:
        return self.kube.get_object(f"{PODS}/{name}")

    async def phase_reaches_the_api(self, name: str, phase: str, *, steps: int) -> None:
        """Wait (`steps` of 10 ms) until the apiserver holds `phase` for pod `name`."""
        for _ in range(steps):
            api = self.api(name)
            if api is not None and api.get("status", {}).get("phase") == phase:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{name}: phase {phase} never reached the apiserver")

    def sources_ready(self) -> None:
        for s in ("api", "file"):
            self.bus.seed(self.sources, s, SourceState(source=s, ready=True, at=1.0))


WEB = make_api_pod("web")


async def test_status_sent_once_per_change() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)
    await w.report(WEB, version=1, status={"phase": "Running", "podIP": "10.1.0.2"})
    await w.sync.sync_statuses()
    api = w.api("web")
    assert api is not None and api["status"]["podIP"] == "10.1.0.2"
    assert w.kube.count("PATCH") == 1
    await w.sync.sync_statuses()
    assert w.kube.count("PATCH") == 1  # nothing new
    await w.report(WEB, version=2, status={"phase": "Running", "podIP": "10.1.0.2"})
    await w.sync.sync_statuses()
    assert w.kube.count("PATCH") == 1  # a new version with the same content
    await w.report(WEB, version=3, phase="Succeeded")
    await w.sync.sync_statuses()
    api = w.api("web")
    assert api is not None and api["status"]["phase"] == "Succeeded"
    assert w.kube.count("PATCH") == 2


async def test_a_restarted_reporter_patches_only_what_changed() -> None:
    # The apiserver holds what an earlier process sent; this one has sent nothing yet.
    w = World()
    same = {
        "phase": "Running",
        "podIP": "10.1.0.2",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Initialized", "status": "True"},
        ],
    }
    other = make_api_pod("other")
    for pod in (WEB, other):
        w.admin_creates(pod)
        await w.want(pod)
    w.kube.objects[f"{PODS}/web"]["status"] = {
        **same,
        # the same conditions in another order, and one the kubelet does not own
        "conditions": [
            {"type": "example.com/gate", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
    }
    w.kube.objects[f"{PODS}/other"]["status"] = {**same, "podIP": "10.1.0.3"}
    await w.report(WEB, version=1, status=same)
    await w.report(other, version=1, status={**same, "podIP": "10.1.0.9"})
    await w.sync.resync()
    assert w.kube.count("GET", f"{PODS}/") == 1 and w.kube.count("PATCH") == 1  # other only
    api = w.api("other")
    assert api is not None and api["status"]["podIP"] == "10.1.0.9"
    await w.sync.resync()
    assert w.kube.count("PATCH") == 1
    # What changes later is sent as before.
    await w.report(WEB, version=2, status={**same, "podIP": "10.1.0.4"})
    await w.sync.sync_statuses()
    api = w.api("web")
    assert w.kube.count("PATCH") == 2 and api is not None and api["status"]["podIP"] == "10.1.0.4"
    assert [c["type"] for c in api["status"]["conditions"]][0] == "example.com/gate"


async def test_ephemeral_container_statuses_reach_the_apiserver() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)
    app = {"name": "app", "state": {"running": {}}, "restartCount": 0}
    debugger = {
        "name": "debugger",
        "state": {"running": {"startedAt": "2026-11-26T08:00:00Z"}},
        "imageID": "sha256:abc",
        "containerID": "containerd://d1",
        "ready": False,
    }
    status = {"phase": "Running", "containerStatuses": [app]}
    await w.report(WEB, version=1, status=status)
    await w.sync.sync_statuses()
    await w.report(WEB, version=2, status={**status, "ephemeralContainerStatuses": [debugger]})
    await w.sync.sync_statuses()
    api = w.api("web")
    assert api is not None and api["status"]["ephemeralContainerStatuses"] == [debugger]
    assert api["status"]["containerStatuses"] == [app]
    assert w.kube.count("PATCH") == 2


async def test_foreign_conditions_kept() -> None:
    w = World()
    pod = w.admin_creates(WEB)
    w.kube.objects[f"{PODS}/web"]["status"] = {
        "conditions": [{"type": "example.com/gate", "status": "True"}]
    }
    await w.want(pod)
    await w.report(
        WEB,
        version=1,
        status={"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    )
    await w.sync.sync_statuses()
    api = w.api("web")
    assert api is not None
    assert [c["type"] for c in api["status"]["conditions"]] == ["example.com/gate", "Ready"]


async def test_illegal_transition_never_sent(caplog: pytest.LogCaptureFixture) -> None:
    w = World()
    pod = make_api_pod("job")
    pod["spec"]["restartPolicy"] = "Never"
    w.admin_creates(pod)
    await w.want(pod)
    done = {
        "phase": "Running",
        "containerStatuses": [{"name": "app", "state": {"terminated": {"exitCode": 0}}}],
    }
    again = {"phase": "Running", "containerStatuses": [{"name": "app", "state": {"running": {}}}]}
    await w.report(pod, version=1, status=done)
    await w.sync.sync_statuses()
    await w.report(pod, version=2, status=again)
    caplog.set_level(logging.ERROR)
    await w.sync.sync_statuses()
    await w.sync.sync_statuses()
    api = w.api("job")
    assert api is not None and "terminated" in api["status"]["containerStatuses"][0]["state"]
    assert [r.message for r in caplog.records].count("status refused") == 1


async def test_deleted_pod_is_forgotten() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)
    await w.report(WEB, version=1)
    del w.kube.objects[f"{PODS}/web"]
    await w.sync.sync_statuses()
    assert w.kube.count("GET") == 1
    await w.report(WEB, version=2, phase="Failed")
    await w.sync.sync_statuses()
    assert w.kube.count("GET") == 1  # forgotten: no more calls
    assert w.sync.sent(PodUID("uid-web")) is None


async def test_recreated_pod_gets_no_old_status() -> None:
    w = World()
    await w.want(WEB)
    w.kube.put(f"{PODS}/web", {**WEB, "metadata": {**WEB["metadata"], "uid": "uid-new"}})
    await w.report(WEB, version=1, phase="Failed")
    await w.sync.sync_statuses()
    assert w.kube.count("PATCH") == 0
    api = w.api("web")
    assert api is not None and "status" not in api


async def test_finished_pod_deleted_after_its_final_status() -> None:
    w = World()
    w.admin_creates(WEB)
    w.kube.mark_deleted(f"{PODS}/web")
    await w.want(WEB)
    await w.report(WEB, version=1, phase="Running")
    await w.sync.sync_statuses()
    assert w.api("web") is not None  # still running containers: not deleted
    await w.report(WEB, version=2, phase="Succeeded", terminated=True)
    await w.sync.sync_statuses()
    assert w.api("web") is None
    methods = [m for m, p in w.kube.calls if p.endswith("/web") or p.endswith("/web/status")]
    assert methods[-2:] == ["PATCH", "DELETE"]  # the final status first
    await w.sync.sync_statuses()
    assert w.kube.count("DELETE") == 1


async def test_terminated_pod_not_being_deleted_stays() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)
    await w.report(WEB, version=1, phase="Failed", terminated=True)
    await w.sync.sync_statuses()
    assert w.api("web") is not None and w.kube.count("DELETE") == 0


async def test_deletion_seen_on_resync_deletes_an_already_reported_pod() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)
    await w.report(WEB, version=1, phase="Succeeded", terminated=True)
    await w.sync.resync()
    assert w.api("web") is not None
    w.kube.mark_deleted(f"{PODS}/web")
    await w.sync.resync()
    assert w.api("web") is None


STATIC = make_static_pod("etcd", uid="hash-1")
MIRROR = f"{PODS}/etcd-node1"


async def test_static_pod_gets_a_mirror_with_its_status() -> None:
    w = World()
    await w.want(STATIC, "file")
    await w.report(STATIC, version=1, status={"phase": "Running", "podIP": "10.0.0.5"})
    await w.sync.sync_statuses()
    assert w.kube.count("PATCH") == 0  # no mirror yet: the status waits
    await w.sync.resync()
    mirror = w.kube.get_object(MIRROR)
    assert mirror is not None
    assert mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] == "hash-1"
    assert mirror["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    assert mirror["status"]["podIP"] == "10.0.0.5"
    assert w.sync.mirror_uid(PodUID("hash-1")) == mirror["metadata"]["uid"]
    assert w.registry.get_sample_value("kubelet_mirror_pods") == 1
    await w.sync.resync()
    assert w.kube.count("POST") == 1
    assert w.registry.get_sample_value("kubelet_mirror_pods") == 1


async def test_mirror_recreated_when_deleted() -> None:
    w = World()
    await w.want(STATIC, "file")
    await w.report(STATIC, version=1)
    await w.sync.resync()
    first = w.kube.get_object(MIRROR)
    assert first is not None
    del w.kube.objects[MIRROR]  # kubectl delete --grace-period=0
    await w.sync.resync()
    second = w.kube.get_object(MIRROR)
    assert second is not None and second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["status"]["phase"] == "Running"  # the status is sent to the new mirror

    w.kube.mark_deleted(MIRROR)  # kubectl delete: graceful
    await w.sync.resync()
    third = w.kube.get_object(MIRROR)
    assert third is not None and "deletionTimestamp" not in third["metadata"]
    assert third["metadata"]["uid"] != second["metadata"]["uid"]


async def test_mirror_gone_during_status_patch_is_recreated_soon() -> None:
    w = World()
    await w.want(STATIC, "file")
    await w.report(STATIC, version=1)
    await w.sync.resync()
    del w.kube.objects[MIRROR]
    await w.report(STATIC, version=2, phase="Failed")
    await w.sync.sync_statuses()
    assert w.sync._resync_soon  # noqa: SLF001 - the early resync request is the behaviour


async def test_mirror_replaced_when_static_pod_changes() -> None:
    w = World()
    await w.want(STATIC, "file")
    await w.sync.resync()
    changed = make_static_pod("etcd", uid="hash-2")
    w.bus.drop(w.desired, *w.bus.rows(w.desired))
    await w.want(changed, "file")
    await w.sync.resync()
    mirror = w.kube.get_object(MIRROR)
    assert mirror is not None
    assert mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] == "hash-2"


async def test_orphan_mirror_deleted_only_when_sources_ready() -> None:
    w = World()
    await w.want(STATIC, "file")
    await w.sync.resync()
    w.bus.drop(w.desired, *w.bus.rows(w.desired))
    await w.cache.reload()
    await w.sync.resync()
    assert w.kube.get_object(MIRROR) is not None  # sources not ready: "gone" may be "not read"
    assert w.registry.get_sample_value("kubelet_mirror_pods") == 1  # the orphan still counts
    w.sources_ready()
    await w.sync.resync()
    assert w.kube.get_object(MIRROR) is None
    assert w.registry.get_sample_value("kubelet_mirror_pods") == 0


async def test_no_mirror_before_the_node_is_known() -> None:
    w = World()
    w.identity.forget()
    await w.want(STATIC, "file")
    await w.sync.resync()
    assert w.kube.get_object(MIRROR) is None
    w.identity.set_uid("node-uid")
    await w.sync.resync()
    assert w.kube.get_object(MIRROR) is not None


async def test_outage_logged_once_and_healed(caplog: pytest.LogCaptureFixture) -> None:
    w = World()
    w.admin_creates(WEB)
    w.admin_creates(make_api_pod("other"))
    await w.want(WEB)
    await w.want(make_api_pod("other"))
    await w.report(WEB, version=1)
    await w.report(make_api_pod("other"), version=1)
    w.kube.down = True
    caplog.set_level(logging.WARNING)
    await w.sync.resync()
    await w.sync.sync_statuses()
    assert w.kube.count("GET", "/pods/") == 1  # the pass stops at the first failure
    assert [r.message for r in caplog.records].count("apiserver unavailable") == 1
    w.kube.down = False
    await w.sync.resync()
    api = w.api("web")
    assert api is not None and api["status"]["phase"] == "Running"


async def test_after_an_outage_the_loop_tries_again_within_the_gap_not_the_resync() -> None:
    # The resync period is far longer than the test waits: only the minimum gap after a
    # failed pass can bring the status to the apiserver once it is back.
    w = World(resync_s=3600.0)
    w.admin_creates(WEB)
    await w.want(WEB)
    w.kube.down = True
    task = asyncio.create_task(w.sync.run())
    try:
        await w.report(WEB, version=1, phase="Succeeded")
        for _ in range(100):
            if w.kube.count("GET") or w.kube.count("PATCH"):
                break
            await asyncio.sleep(0.01)
        w.kube.down = False  # back, and nothing in the view changes any more
        await w.phase_reaches_the_api("web", "Succeeded", steps=300)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_loop_follows_the_view() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)
    task = asyncio.create_task(w.sync.run())
    try:
        await w.report(WEB, version=1, phase="Succeeded")
        await w.phase_reaches_the_api("web", "Succeeded", steps=200)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_sent_status_is_timed_from_its_first_unsent_change() -> None:
    w = World()
    w.admin_creates(WEB)
    await w.want(WEB)

    def synced() -> tuple[float | None, float | None]:
        get = w.registry.get_sample_value
        return (
            get("kubelet_pod_status_sync_duration_seconds_count"),
            get("kubelet_pod_status_sync_duration_seconds_sum"),
        )

    assert synced() == (0, 0)
    await w.report(WEB, version=1)  # computed at 1
    w.now = 1.25
    await w.sync.sync_statuses()
    assert synced() == (1, 0.25)
    await w.report(WEB, version=2)  # the same status: nothing to send, nothing timed
    w.now = 9.0
    await w.sync.sync_statuses()
    assert synced() == (1, 0.25)
    await w.report(WEB, version=3, phase="Succeeded")  # computed at 3
    w.kube.down = True
    w.now = 4.0
    await w.sync.sync_statuses()  # not taken: still pending from 3
    w.kube.down = False
    await w.report(WEB, version=4, phase="Failed")
    w.now = 5.5
    await w.sync.sync_statuses()
    assert synced() == (2, 0.25 + 2.5)  # from the first change not yet sent (3)


def _readiness(ready: bool, ip: str = "10.1.0.2") -> JSON:
    flag = "True" if ready else "False"
    return {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": flag}]}


async def _sent_ready(w: World, names: tuple[str, ...]) -> dict[str, JSON]:
    pods = {n: make_api_pod(n) for n in names}
    for p in pods.values():
        w.admin_creates(p)
        await w.want(p)
        await w.report(p, version=1, status=_readiness(True))
    await w.sync.sync_statuses()
    w.kube.calls.clear()
    return pods


def _patched(w: World) -> list[str]:
    return [p.rsplit("/", 2)[-2] for m, p in w.kube.calls if m == "PATCH"]


async def test_a_readiness_change_is_patched_before_unrelated_queued_statuses() -> None:
    w = World()
    pods = await _sent_ready(w, ("a", "b", "c"))
    await w.report(pods["a"], version=2, status=_readiness(True, ip="10.1.0.7"))
    await w.report(pods["b"], version=2, status=_readiness(True, ip="10.1.0.8"))
    await w.report(pods["c"], version=2, status=_readiness(False))
    await w.sync.sync_statuses()
    assert _patched(w) == ["c", "a", "b"]


async def test_a_readiness_change_arriving_mid_pass_goes_next() -> None:
    # A pass over three unrelated changes; while the first one's PATCH is out, c's
    # readiness flips: c is sent next, before the two still queued.
    w = World()
    pods = await _sent_ready(w, ("a", "b", "c", "d"))
    for n in ("a", "b", "d"):
        await w.report(pods[n], version=2, status=_readiness(True, ip="10.1.0.9"))
    patch = w.kube.patch

    async def patch_then_flip(path: str, body: Any, **kw: Any) -> Any:
        if not _patched(w):
            await w.report(pods["c"], version=2, status=_readiness(False))
        return await patch(path, body, **kw)

    w.kube.patch = patch_then_flip  # type: ignore[method-assign]
    await w.sync.sync_statuses()
    assert _patched(w) == ["a", "c", "b", "d"]

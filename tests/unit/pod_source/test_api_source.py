"""The apiserver source against a stateful fake apiserver (no network): a full snapshot
after the list, watch events applied as new snapshots, BOOKMARK moving the
resourceVersion, 410 Gone relisting (REMOVE for what vanished meanwhile), errors keeping
the last set with growing back-off and one log line per outage, mirror and foreign pods
skipped, a graceful deletion merged as DELETE with the deletion fields and REMOVE once
the object is gone, the merge's config.* annotations, and the wiring with --kubeconfig."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from klet.config import load_settings
from klet.kube import Forbidden, Unavailable
from klet.model.pod import CONFIG_MIRROR, CONFIG_SEEN, CONFIG_SOURCE
from klet.model.records import ChangeOp
from klet.model.timestamps import rfc3339_nano
from klet.model.types import JSON
from klet.pod_source.inbox import Inbox
from klet.pod_source.metrics import Metrics, create_metrics
from klet.pod_source.podconfig import PodConfigState, merge_snapshot
from klet.pod_source.publisher import RetryPolicy
from klet.pod_source.sources.api import ApiSource
from klet.pod_source.wiring import Overrides, build_deps
from klet.testbed.fakes.podapi import DELETION_TIMESTAMP, FakePodApi
from prometheus_client import CollectorRegistry

NODE = "node1"
RETRY = RetryPolicy(initial_s=1.0, max_s=4.0, factor=2.0)


def api_pod(name: str, *, node: str = NODE, **meta: Any) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "team-a", **meta},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx:1.25"}]},
        "status": {"phase": "Pending"},
    }


class Harness:
    """A source on a fake apiserver, its inbox and metrics, and the merge behind them."""

    def __init__(self) -> None:
        self.api = FakePodApi()
        self.inbox = Inbox()
        self.registry = CollectorRegistry()
        self.metrics: Metrics = create_metrics(self.registry)
        self.source = ApiSource(
            api=self.api, node_name=NODE, inbox=self.inbox, metrics=self.metrics, retry=RETRY
        )
        self.state = PodConfigState()
        self.now = 1_700_000_000.0

    def snapshot(self) -> list[JSON] | None:
        """The pending snapshot of the api source, if any (taken)."""
        pending, _ = self.inbox.take()
        return pending.get("api")

    def names(self) -> set[str] | None:
        snap = self.snapshot()
        return None if snap is None else {p["metadata"]["name"] for p in snap}

    def merge(self) -> list[tuple[ChangeOp, str]]:
        """Merge the pending snapshot (if any) and return its operations."""
        snap = self.snapshot()
        if snap is None:
            return []
        self.now += 1
        self.state, changes = merge_snapshot(self.state, "api", snap, self.now)
        return [(op, p.pod["metadata"]["name"]) for op, p in changes.ops()]

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def h() -> Harness:
    return Harness()


async def test_list_gives_a_full_snapshot(h: Harness) -> None:
    a = h.api.create(api_pod("a"))
    h.api.create(api_pod("b"))
    assert not h.source.listed
    assert await h.source.run_once() == 0.0
    assert h.api.calls == ["list"]
    assert h.source.listed
    assert h.source.resource_version == str(h.api.rv)
    snap = h.snapshot()
    assert snap is not None and {p["metadata"]["name"] for p in snap} == {"a", "b"}
    (first,) = [p for p in snap if p["metadata"]["name"] == "a"]
    assert first["metadata"]["uid"] == a["metadata"]["uid"]  # the apiserver's UID
    assert first["kind"] == "Pod"
    assert h.metric("klet_pod_source_snapshots_total", source="api") == 1


async def test_empty_list_is_still_a_snapshot(h: Harness) -> None:
    await h.source.run_once()
    assert h.snapshot() == []  # the source becomes ready with no pods


async def test_watch_events_are_applied(h: Harness) -> None:
    a = h.api.create(api_pod("a"))
    await h.source.run_once()
    assert h.merge() == [("ADD", "a")]

    h.api.create(api_pod("b"))
    h.api.update({**a, "metadata": {**a["metadata"], "labels": {"v": "2"}}})
    assert await h.source.run_once() == 0.0
    assert h.api.calls == ["list", f"watch {a['metadata']['resourceVersion']}"]
    assert h.merge() == [("ADD", "b"), ("UPDATE", "a")]
    assert h.source.resource_version == str(h.api.rv)

    h.api.delete(a["metadata"]["uid"])
    await h.source.run_once()
    assert h.merge() == [("REMOVE", "a")]
    assert set(h.source.pods) == {p["metadata"]["uid"] for p in h.api.pods.values()}
    # every watch resumes where the last one ended
    assert h.api.calls[-1] == f"watch {int(a['metadata']['resourceVersion']) + 2}"
    assert h.metric("klet_pod_source_api_watches_total") == 2  # both ended without an error


async def test_status_only_change_is_a_reconcile(h: Harness) -> None:
    a = h.api.create(api_pod("a"))
    await h.source.run_once()
    h.merge()
    h.api.update({**a, "status": {"phase": "Running"}})
    await h.source.run_once()
    assert h.merge() == [("RECONCILE", "a")]


async def test_bookmark_moves_the_resource_version_only(h: Harness) -> None:
    await h.source.run_once()
    h.snapshot()
    h.api.bookmark()
    await h.source.run_once()
    assert h.source.resource_version == str(h.api.rv)
    pending, polled = h.inbox.take()
    assert pending == {} and polled


async def test_gone_relists(h: Harness) -> None:
    a = h.api.create(api_pod("a"))
    await h.source.run_once()
    h.merge()
    # While the watch was away: a deleted, b created, and the history compacted.
    h.api.delete(a["metadata"]["uid"])
    h.api.create(api_pod("b"))
    h.api.compact()
    assert await h.source.run_once() == 0.0  # 410: relist at once, no back-off
    assert h.source.resource_version is None
    assert h.snapshot() is None  # nothing offered for the failed watch
    assert h.metric("klet_pod_source_api_watch_errors_total", reason="expired") == 1

    await h.source.run_once()
    assert h.api.calls[-1] == "list"
    assert h.merge() == [("REMOVE", "a"), ("ADD", "b")]
    assert h.metric("klet_pod_source_api_relists_total") == 1
    assert h.source.resource_version == str(h.api.rv)


async def test_apiserver_down_before_the_first_list(h: Harness) -> None:
    h.api.create(api_pod("a"))
    h.api.list_errors = [Unavailable("connection refused"), Unavailable("connection refused")]
    assert await h.source.run_once() == 1.0
    assert await h.source.run_once() == 2.0
    assert not h.source.listed and h.snapshot() is None  # never read: not ready
    assert await h.source.run_once() == 0.0
    assert h.names() == {"a"}
    assert h.metric("klet_pod_source_api_watch_errors_total", reason="unavailable") == 2
    assert h.metric("klet_pod_source_api_relists_total") == 0  # the first list succeeded late


async def test_errors_keep_the_last_set_and_log_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.api.create(api_pod("a"))
    await h.source.run_once()
    h.merge()
    rv = h.source.resource_version
    h.api.watch_errors = [Unavailable("connection refused") for _ in range(4)]
    with caplog.at_level(logging.DEBUG, logger="klet.pod_source.sources.api"):
        delays = [await h.source.run_once() for _ in range(4)]
    assert delays == [1.0, 2.0, 4.0, 4.0]  # exponential, bounded
    assert h.snapshot() is None  # nothing offered: the merge keeps pod a
    assert h.source.resource_version == rv  # resumes the watch, no relist
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert h.metric("klet_pod_source_api_watch_errors_total", reason="unavailable") == 4

    h.api.create(api_pod("b"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="klet.pod_source.sources.api"):
        assert await h.source.run_once() == 0.0
    assert h.api.calls[-1] == f"watch {rv}"
    assert h.merge() == [("ADD", "b")]
    assert any("working again" in r.getMessage() for r in caplog.records)
    assert h.api.calls.count("list") == 1


async def test_connection_lost_mid_watch_keeps_what_arrived(h: Harness) -> None:
    await h.source.run_once()
    h.snapshot()
    h.api.create(api_pod("a"))
    h.api.break_watch = Unavailable("connection reset by peer")
    assert await h.source.run_once() == 1.0
    assert h.names() == {"a"}
    assert h.source.resource_version == str(h.api.rv)


async def test_forbidden_is_an_error_and_retried(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.api.list_errors = [Forbidden("pods is forbidden", status=403)]
    with caplog.at_level(logging.ERROR, logger="klet.pod_source.sources.api"):
        assert await h.source.run_once() == 1.0
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert h.metric("klet_pod_source_api_watch_errors_total", reason="forbidden") == 1
    assert await h.source.run_once() == 0.0
    assert h.source.listed


async def test_a_watch_that_ends_at_once_is_not_restarted_at_once(h: Harness) -> None:
    await h.source.run_once()
    assert await h.source.run_once() == 1.0  # no events, ended immediately
    h.api.create(api_pod("a"))
    assert await h.source.run_once() == 0.0


async def test_mirror_and_foreign_pods_are_skipped(h: Harness) -> None:
    h.api.create(api_pod("static-node1", annotations={CONFIG_MIRROR: "hash"}))
    h.api.create(api_pod("elsewhere", node="node2"))
    h.api.create(api_pod("mine"))
    await h.source.run_once()
    assert h.names() == {"mine"}
    h.api.create(api_pod("static2-node1", annotations={CONFIG_MIRROR: "hash2"}))
    await h.source.run_once()
    assert h.snapshot() is None
    # the foreign pod is counted once, mirror pods not at all (they are expected)
    assert h.metric("klet_pod_source_manifest_errors_total", source="api", reason="invalid") == 1


async def test_graceful_deletion_then_removal(h: Harness) -> None:
    a = h.api.create(api_pod("a", labels={"app": "a"}))
    uid = a["metadata"]["uid"]
    await h.source.run_once()
    assert h.merge() == [("ADD", "a")]

    h.api.delete(uid, grace=30)  # kubectl delete --wait=false
    await h.source.run_once()
    assert h.merge() == [("DELETE", "a")]  # upstream's graceful-delete op
    meta = h.state.source_pods("api")[uid].pod["metadata"]
    assert meta["deletionTimestamp"] == DELETION_TIMESTAMP
    assert meta["deletionGracePeriodSeconds"] == 30

    shorter = h.api.pods[uid]
    shorter["metadata"]["deletionGracePeriodSeconds"] = 0  # --grace-period=0 --force
    h.api.update(shorter)
    await h.source.run_once()
    assert h.merge() == [("DELETE", "a")]  # still being deleted: a semantic change
    assert h.state.source_pods("api")[uid].pod["metadata"]["deletionGracePeriodSeconds"] == 0

    h.api.delete(uid)  # the object is gone
    await h.source.run_once()
    assert h.merge() == [("REMOVE", "a")]


async def test_object_gone_while_away_is_removed_by_the_relist(h: Harness) -> None:
    a = h.api.create(api_pod("a"))
    await h.source.run_once()
    h.merge()
    h.api.delete(a["metadata"]["uid"], grace=30)
    h.api.delete(a["metadata"]["uid"])
    h.api.compact()
    await h.source.run_once()
    await h.source.run_once()
    assert h.merge() == [("REMOVE", "a")]


async def test_merge_records_source_and_first_seen(h: Harness) -> None:
    a = h.api.create(api_pod("a"))
    await h.source.run_once()
    h.merge()
    merged = h.state.source_pods("api")[a["metadata"]["uid"]]
    annotations = merged.pod["metadata"]["annotations"]
    assert annotations[CONFIG_SOURCE] == "api"
    assert annotations[CONFIG_SEEN] == rfc3339_nano(h.now)
    assert merged.pod["metadata"]["name"] == "a" and merged.source == "api"


async def test_run_closes_the_client_when_cancelled(h: Harness) -> None:
    task = asyncio.create_task(h.source.run())
    for _ in range(20):
        await asyncio.sleep(0)
    assert h.source.listed
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert h.api.closed


def test_wiring_adds_the_api_source_with_a_kubeconfig(tmp_path: Path) -> None:
    def sources(*argv: str) -> tuple[list[str], frozenset[str]]:
        settings = load_settings(
            ["--hostname-override", NODE, "--run-dir", str(tmp_path), *argv],
            env={},
            service="pod-source",
        )
        deps = build_deps(settings, Overrides(registry=CollectorRegistry(), pod_api=FakePodApi()))
        asyncio.run(deps.close())
        return [s.name for s in deps.sources], frozenset(deps.configured)

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    assert sources("--kubeconfig", str(kubeconfig)) == (["api"], frozenset({"api"}))
    assert sources() == ([], frozenset())

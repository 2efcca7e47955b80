"""syncloop's metric recorders (metrics.py) without a running prober or controller.

Covers: the `reason` label of kubelet_admission_rejections_total follows upstream's
allowlist (known reasons as they are, other `OutOf<resource>` as
OutOfExtendedResources, the rest as Other); ProberMetrics deletes a removed pod's
prober_probe_total series, and its prober_probe_duration_seconds series only once no
other pod with the same name still has it; the PLEG relist interval runs from one
relist's start to the next one's; the PodResources API's requests counter is served at
0 for v1 before any call and counts every method, and its per-method requests and errors
come out under upstream's exact names (no `_total`), which prometheus_client's parser
reads back with their values; an UnsuffixedCounter refuses a wrong label count and a
decrease; kubelet_orphan_pod_cleaned_volumes and _errors follow the volume manager's last
orphan sweep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.model.types import JSON
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.metrics import (
    PodResourcesMetrics,
    UnsuffixedCounter,
    admission_rejection_reason,
    create_metrics,
    orphan_sweeps,
)
from klet.syncloop.probing.prober import ProbeRun
from klet.syncloop.probing.proberesults import ProbeKind
from klet.syncloop.volumes.base import VolumeContext, VolumeError
from klet.syncloop.volumes.manager import VolumeManager
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("OutOfpods", "OutOfpods"),
        ("OutOfcpu", "OutOfcpu"),
        ("OutOfmemory", "OutOfmemory"),
        ("OutOfephemeral-storage", "OutOfephemeral-storage"),
        ("OutOfexample.com/gpu", "OutOfExtendedResources"),
        ("OutOfhugepages-2Mi", "OutOfExtendedResources"),
        ("Evicted", "Evicted"),
        ("PodOSNotSupported", "PodOSNotSupported"),
        ("PodOSSelectorNodeLabelDoesNotMatch", "PodOSSelectorNodeLabelDoesNotMatch"),
        ("SysctlForbidden", "SysctlForbidden"),
        ("NodeAffinity", "Other"),
        ("NodeName", "Other"),
        ("NodePorts", "Other"),
        ("", "Other"),
    ],
)
def test_admission_rejection_reason(reason: str, label: str) -> None:
    assert admission_rejection_reason(reason) == label


def run(uid: str, *, ok: bool) -> ProbeRun:
    return ProbeRun(
        kind=ProbeKind.READINESS,
        pod_uid=uid,
        pod="web-0",
        namespace="default",
        container="app",
        ok=ok,
        duration_s=0.25,
    )


def test_duration_series_stays_while_a_pod_of_the_same_name_has_it() -> None:
    registry = CollectorRegistry()
    metrics = create_metrics(registry)
    base = {"probe_type": "Readiness", "container": "app", "pod": "web-0", "namespace": "default"}

    def total(uid: str, result: str) -> float | None:
        labels = {**base, "result": result, "pod_uid": uid}
        return registry.get_sample_value("prober_probe_total", labels)

    def timed() -> float | None:
        return registry.get_sample_value("prober_probe_duration_seconds_count", base)

    metrics.prober.observe(run("old", ok=True))
    metrics.prober.observe(run("old", ok=False))
    metrics.prober.observe(run("new", ok=True))  # the pod recreated under its name
    assert (total("old", "successful"), total("old", "failed")) == (1, 1)
    assert timed() == 2
    metrics.prober.forget_pod("old")
    assert total("old", "successful") is None and total("old", "failed") is None
    assert total("new", "successful") == 1
    assert timed() == 2  # still the new pod's series
    metrics.prober.forget_pod("new")
    assert total("new", "successful") is None and timed() is None
    metrics.prober.forget_pod("never-probed")  # nothing to delete, nothing raised


def test_admission_rejections_are_counted_by_upstream_label() -> None:
    registry = CollectorRegistry()
    metrics = create_metrics(registry)
    for reason in ("OutOfpods", "OutOfexample.com/gpu", "NodePorts", "OutOfpods"):
        metrics.record_admission_rejection(reason)
    count = {
        label: registry.get_sample_value("kubelet_admission_rejections_total", {"reason": label})
        for label in ("OutOfpods", "OutOfExtendedResources", "Other", "OutOfcpu")
    }
    assert count == {"OutOfpods": 2, "OutOfExtendedResources": 1, "Other": 1, "OutOfcpu": None}


def test_relist_interval_runs_from_start_to_start_of_successive_relists() -> None:
    registry = CollectorRegistry()
    relists = create_metrics(registry).pleg_relists

    def value(name: str, le: str | None = None) -> float | None:
        labels = {} if le is None else {"le": le}
        return registry.get_sample_value(name, labels)

    relists.relisted(0.5, now=100.5)  # started at 100.0: nothing to measure from yet
    assert value("kubelet_pleg_relist_interval_seconds_count") == 0
    relists.relisted(0.25, now=101.25)  # started at 101.0
    relists.relisted(0.5, now=104.5)  # started at 104.0
    assert value("kubelet_pleg_relist_duration_seconds_count") == 3
    assert value("kubelet_pleg_relist_interval_seconds_count") == 2
    assert value("kubelet_pleg_relist_interval_seconds_sum") == pytest.approx(4.0)
    assert value("kubelet_pleg_relist_interval_seconds_bucket", "0.5") == 0
    assert value("kubelet_pleg_relist_interval_seconds_bucket", "1.0") == 1
    assert value("kubelet_pleg_relist_interval_seconds_bucket", "2.5") == 1
    assert value("kubelet_pleg_relist_interval_seconds_bucket", "5.0") == 2


def test_pod_resources_requests_count_every_method_of_v1() -> None:
    registry = CollectorRegistry()
    metrics = PodResourcesMetrics.create(registry)
    name = "kubelet_pod_resources_endpoint_requests_total"
    v1 = {"server_api_version": "v1"}
    assert registry.get_sample_value(name, v1) == 0
    for method in ("List", "Get", "GetAllocatableResources"):
        metrics.request(method)
    assert registry.get_sample_value(name, v1) == 3


def _served(registry: CollectorRegistry) -> dict[str, float]:
    """Every sample of the text exposition as prometheus_client's parser reads it, by
    `name{labels}` (what status-reporter's merge reads from syncloop's /metrics)."""
    text = generate_latest(registry).decode()
    return {
        f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_pod_resources_per_method_series_keep_upstreams_names() -> None:
    registry = CollectorRegistry()
    metrics = PodResourcesMetrics.create(registry)
    before = _served(registry)
    for kind in ("requests", "errors"):
        for method in ("list", "get", "get_allocatable"):
            key = f"kubelet_pod_resources_endpoint_{kind}_{method}{{server_api_version=v1}}"
            assert before[key] == 0, key
    for method in ("List", "List", "Get", "GetAllocatableResources", "Get"):
        metrics.request(method)
    metrics.error("Get")
    after = _served(registry)
    assert after["kubelet_pod_resources_endpoint_requests_list{server_api_version=v1}"] == 2
    assert after["kubelet_pod_resources_endpoint_requests_get{server_api_version=v1}"] == 2
    assert (
        after["kubelet_pod_resources_endpoint_requests_get_allocatable{server_api_version=v1}"] == 1
    )
    assert after["kubelet_pod_resources_endpoint_errors_get{server_api_version=v1}"] == 1
    assert after["kubelet_pod_resources_endpoint_errors_list{server_api_version=v1}"] == 0
    assert after["kubelet_pod_resources_endpoint_requests_total{server_api_version=v1}"] == 5
    text = generate_latest(registry).decode()
    assert "# TYPE kubelet_pod_resources_endpoint_requests_list untyped\n" in text
    assert 'kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 2.0\n' in text
    assert "kubelet_pod_resources_endpoint_requests_list_total" not in text


def test_unsuffixed_counter_only_goes_up_on_its_labels() -> None:
    registry = CollectorRegistry()
    counter = UnsuffixedCounter("x_count", "help", ["a"], registry=registry)
    with pytest.raises(ValueError, match="labels"):
        counter.inc()
    with pytest.raises(ValueError, match="cannot go down"):
        counter.inc("1", amount=-1)
    counter.inc("1", amount=2.5)
    assert counter.value("1") == 2.5 and counter.value("2") is None
    assert _served(registry) == {"x_count{a=1}": 2.5}
    with pytest.raises(ValueError, match="Duplicated"):  # the registry checks its name
        UnsuffixedCounter("x_count", "again", registry=registry)


async def test_the_last_orphan_sweep_is_published(tmp_path: Path) -> None:
    class Stuck:
        """A plugin whose volumes cannot be torn down."""

        dir_name = "klet.test~stuck"

        def handles(self, volume: JSON) -> bool:
            return False

        async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path:
            raise VolumeError("not used")

        async def tear_down(self, path: Path) -> None:
            raise VolumeError("device busy")

    registry = CollectorRegistry()
    m = VolumeManager(
        [Stuck()], root_dir=tmp_path, node=NodeFacts(), orphans=orphan_sweeps(registry)
    )
    for uid in ("keep", "gone", "other"):
        (tmp_path / "pods" / uid / "etc-hosts").parent.mkdir(parents=True)
    (tmp_path / "pods/stuck/volumes/klet.test~stuck/data").mkdir(parents=True)

    def swept() -> tuple[float | None, float | None]:
        get = registry.get_sample_value
        return get("kubelet_orphan_pod_cleaned_volumes"), get(
            "kubelet_orphan_pod_cleaned_volumes_errors"
        )

    assert swept() == (0, 0)
    assert await m.clean_orphans(keep={"keep"}) == ["gone", "other"]
    assert swept() == (3, 1)  # three orphans, the stuck one kept
    assert await m.clean_orphans(keep={"keep"}) == []
    assert swept() == (1, 1)  # the last sweep's, not a sum

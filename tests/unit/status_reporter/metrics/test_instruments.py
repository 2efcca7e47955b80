"""Counting running pods and containers from API statuses, desired and active pods by
whether they are static and their ephemeral containers, the build and feature gate
series, and the metric names and labels exposed on a fresh registry."""

from __future__ import annotations

from klet.config.gatelist import GATES
from klet.model.types import JSON
from klet.status_reporter.metrics.instruments import (
    Metrics,
    PodCounts,
    build_info_labels,
    container_state,
    count_pods,
    count_running,
    feature_series,
    register_build_and_features,
    register_cgroup_version,
)
from prometheus_client import CollectorRegistry, generate_latest

RUNNING: JSON = {"state": {"running": {"startedAt": "t"}}}
EXITED: JSON = {"state": {"terminated": {"exitCode": 0}}}
CREATED: JSON = {"state": {"waiting": {}}}
PULLING: JSON = {"state": {"waiting": {"reason": "ContainerCreating"}}}
CRASHLOOP: JSON = {
    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
    "lastState": {"terminated": {"exitCode": 1}},
}


def test_container_state_mapping() -> None:
    assert [container_state(cs) for cs in (RUNNING, EXITED, CREATED, PULLING, CRASHLOOP, {})] == [
        "running",
        "exited",
        "created",
        None,
        "exited",
        None,
    ]


def test_count_running() -> None:
    statuses: list[JSON] = [
        {"phase": "Running", "containerStatuses": [RUNNING, CRASHLOOP]},
        {"phase": "Pending", "initContainerStatuses": [RUNNING], "containerStatuses": [PULLING]},
        {"phase": "Pending", "containerStatuses": [CREATED]},
        {"phase": "Succeeded", "containerStatuses": [EXITED]},
        {"phase": "Running"},  # sandbox up, no container reported yet
    ]
    counts = count_running(statuses)
    assert counts.pods == 3
    assert counts.containers == {"created": 1, "running": 2, "exited": 2}


def test_exposition_names() -> None:
    now = [100.0]
    registry = CollectorRegistry()
    metrics = Metrics(registry, clock=lambda: now[0])
    metrics.observe([{"phase": "Running", "containerStatuses": [RUNNING]}])
    metrics.bus_error()
    now[0] = 107.5
    text = generate_latest(registry).decode()
    assert "kubelet_running_pods 1.0" in text
    assert 'kubelet_running_containers{container_state="running"} 1.0' in text
    assert 'kubelet_running_containers{container_state="created"} 0.0' in text
    assert 'kubelet_running_containers{container_state="exited"} 0.0' in text
    assert "klet_status_reporter_bus_errors_total 1.0" in text
    assert "klet_status_reporter_view_age_seconds 7.5" in text
    metrics.reloaded()
    assert "klet_status_reporter_view_age_seconds 0.0" in generate_latest(registry).decode()


def test_build_info_labels_name_the_kubelet_version_and_platform() -> None:
    labels = build_info_labels(
        version="v1.34.4-klet", system="Linux", machine="x86_64", compiler="cpython"
    )
    assert labels == {
        "major": "1",
        "minor": "34",
        "git_version": "v1.34.4-klet",
        "git_commit": "",
        "git_tree_state": "",
        "build_date": "",
        "go_version": "",
        "compiler": "cpython",
        "platform": "linux/amd64",
    }
    assert build_info_labels(
        version="v1.34.4-klet", system="Linux", machine="aarch64", compiler="cpython"
    )["platform"] == ("linux/arm64")


def test_feature_series_has_every_gate_with_upstreams_stage_and_klets_state() -> None:
    series = {name: (stage, value) for name, stage, value in feature_series({"KubeletPSI": False})}
    assert set(series) == set(GATES)
    assert series["KubeletPSI"] == ("BETA", 0.0)  # turned off
    assert series["AnyVolumeDataSource"] == ("", 1.0)  # GA: upstream's stage label is empty
    assert series["AllAlpha"] == ("ALPHA", 0.0)
    # an Absent gate klet holds off although upstream's default is on
    assert series["UserNamespacesSupport"][1] == 0.0


def test_build_and_features_on_the_registry() -> None:
    registry = CollectorRegistry()
    register_build_and_features(registry, version="v1.34.4-klet", gates={"KubeletPSI": True})
    text = generate_latest(registry).decode()
    assert 'kubernetes_build_info{build_date="",compiler=' in text
    assert 'git_version="v1.34.4-klet"' in text
    assert 'kubernetes_feature_enabled{name="KubeletPSI",stage="BETA"} 1.0' in text
    assert "# TYPE kubernetes_feature_enabled gauge" in text


def _pod(name: str, source: str | None = None) -> JSON:
    annotations = {"kubernetes.io/config.source": source} if source else {}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_count_pods_desired_and_active_by_static() -> None:
    pods = [
        (_pod("api-running"), "Running"),
        (_pod("api-new"), None),  # no status yet: active
        (_pod("api-done", "api"), "Succeeded"),
        (_pod("static-running", "file"), "Running"),
        (_pod("static-failed", "file"), "Failed"),
        (_pod("from-http", "http"), "Pending"),
    ]
    assert count_pods(pods) == PodCounts(desired={"": 3, "true": 3}, active={"": 2, "true": 2})
    assert count_pods([]) == PodCounts(desired={"": 0, "true": 0}, active={"": 0, "true": 0})


def test_desired_and_active_pods_on_the_registry() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    text = generate_latest(registry).decode()
    # both series from the start, as upstream sets both at every housekeeping
    assert 'kubelet_desired_pods{static=""} 0.0' in text
    assert 'kubelet_active_pods{static="true"} 0.0' in text
    metrics.observe_pods([(_pod("a"), "Running"), (_pod("s", "file"), "Succeeded")])
    text = generate_latest(registry).decode()
    assert 'kubelet_desired_pods{static="true"} 1.0' in text
    assert 'kubelet_active_pods{static=""} 1.0' in text
    assert 'kubelet_active_pods{static="true"} 0.0' in text


def test_cgroup_version() -> None:
    registry = CollectorRegistry()
    register_cgroup_version(registry, 2)
    assert "kubelet_cgroup_version 2.0" in generate_latest(registry).decode()


def test_ephemeral_containers_of_the_desired_pods() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert registry.get_sample_value("kubelet_managed_ephemeral_containers") == 0
    debugged = {**_pod("a"), "spec": {"ephemeralContainers": [{"name": "d1"}, {"name": "d2"}]}}
    done = {**_pod("b"), "spec": {"ephemeralContainers": [{"name": "d"}]}}
    metrics.observe_pods([(debugged, "Running"), (done, "Succeeded"), (_pod("c"), None)])
    assert registry.get_sample_value("kubelet_managed_ephemeral_containers") == 3
    metrics.observe_pods([(_pod("c"), None)])
    assert registry.get_sample_value("kubelet_managed_ephemeral_containers") == 0

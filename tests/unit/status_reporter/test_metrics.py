"""Counting running pods and containers from API statuses, and the metric names and
labels exposed on a fresh registry."""

from __future__ import annotations

from klet.model.types import JSON
from klet.status_reporter.metrics import Metrics, container_state, count_running
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

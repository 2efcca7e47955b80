"""klet.obs.runtimeops: upstream's operation_type names for CRI methods, and what one
observed call adds to the three kubelet_runtime_operations_* series."""

from __future__ import annotations

import pytest
from klet.obs.runtimeops import BUCKETS, RuntimeOperationMetrics, operation_type
from prometheus_client import CollectorRegistry


@pytest.mark.parametrize(
    ("method", "op"),
    [
        ("RunPodSandbox", "run_podsandbox"),
        ("ListPodSandbox", "list_podsandbox"),
        ("PodSandboxStatus", "podsandbox_status"),
        ("ListPodSandboxStats", "list_podsandbox_stats"),
        ("ListContainers", "list_containers"),
        ("ContainerStatus", "container_status"),
        ("ExecSync", "exec_sync"),
        ("ImageFsInfo", "image_fs_info"),
        ("ReopenContainerLog", "reopen_container_log"),
        ("UpdateContainerResources", "update_container"),
        ("Version", "version"),
    ],
)
def test_operation_types_are_upstreams(method: str, op: str) -> None:
    assert operation_type(method) == op


def test_buckets_are_upstreams() -> None:
    assert len(BUCKETS) == 14
    assert BUCKETS[0] == 0.005 and BUCKETS[1] == pytest.approx(0.0125)


def test_an_observed_call_counts_its_duration_and_its_failure() -> None:
    registry = CollectorRegistry()
    m = RuntimeOperationMetrics(registry)
    m.observe("RunPodSandbox", 0.2, failed=False)
    m.observe("RunPodSandbox", 0.3, failed=True)
    m.observe("ListContainers", 0.001, failed=False)

    def sample(name: str, op: str) -> float | None:
        return registry.get_sample_value(name, {"operation_type": op})

    assert sample("kubelet_runtime_operations_total", "run_podsandbox") == 2
    assert sample("kubelet_runtime_operations_errors_total", "run_podsandbox") == 1
    assert sample("kubelet_runtime_operations_duration_seconds_sum", "run_podsandbox") == (
        pytest.approx(0.5)
    )
    assert sample("kubelet_runtime_operations_total", "list_containers") == 1
    assert sample("kubelet_runtime_operations_errors_total", "list_containers") is None

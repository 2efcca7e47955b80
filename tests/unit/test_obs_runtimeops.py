"""klet.obs.runtimeops: upstream's operation_type names for CRI methods, and what one
observed call adds to the three kubelet_runtime_operations_* series; RunPodSandbox calls
made through klet.cri's RuntimeClient (a fake stub answering and failing) are timed and
their failures counted by the runtime handler asked for, as upstream's
kubelet_run_podsandbox_duration_seconds and _errors_total."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from klet.cri import CRISettings, RuntimeClient
from klet.cri.errors import CRIError
from klet.cri.types import SandboxConfig
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


async def test_run_podsandbox_is_timed_and_its_errors_counted_by_handler(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    client = RuntimeClient(
        CRISettings(runtime_endpoint=f"unix://{tmp_path}/none.sock"),
        observer=RuntimeOperationMetrics(registry),
    )
    asked: list[str] = []

    async def run(request: Any, **_: Any) -> Any:
        asked.append(request.runtime_handler)
        if request.runtime_handler == "broken":
            raise AioRpcError(
                grpc.StatusCode.UNKNOWN, Metadata(), Metadata(), details="no", debug_error_string=""
            )
        return SimpleNamespace(pod_sandbox_id="sb1")

    client._rt = SimpleNamespace(RunPodSandbox=run)  # type: ignore[assignment]
    config = SandboxConfig(
        name="p", namespace="ns", uid="u1", attempt=0, hostname="p", log_directory="/l"
    )

    def value(name: str, handler: str) -> float | None:
        return registry.get_sample_value(name, {"runtime_handler": handler})

    try:
        assert await client.run_pod_sandbox(config) == "sb1"
        assert await client.run_pod_sandbox(config, runtime_handler="kata") == "sb1"
        with pytest.raises(CRIError):
            await client.run_pod_sandbox(config, runtime_handler="broken")
        assert await client.run_pod_sandbox(config) == "sb1"
    finally:
        await client.close()
    assert asked == ["", "kata", "broken", ""]
    assert value("kubelet_run_podsandbox_duration_seconds_count", "") == 2
    assert value("kubelet_run_podsandbox_duration_seconds_count", "kata") == 1
    assert value("kubelet_run_podsandbox_duration_seconds_count", "broken") == 1
    assert value("kubelet_run_podsandbox_errors_total", "broken") == 1
    assert value("kubelet_run_podsandbox_errors_total", "") is None
    assert value("kubelet_run_podsandbox_errors_total", "kata") is None
    # the other operations are not sandbox runs
    RuntimeOperationMetrics(reg := CollectorRegistry()).observe("StopPodSandbox", 1, failed=True)
    assert (
        reg.get_sample_value(
            "kubelet_run_podsandbox_duration_seconds_count", {"runtime_handler": ""}
        )
        is None
    )

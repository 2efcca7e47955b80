"""The pod facts of klet.model.pod, table-driven.

Covers: the config source (absent means the apiserver); static pods as upstream's
IsStaticPod (every source but `api`, including one status-reporter once missed because
it listed only `file` and `http`); mirror pods; critical pods (static, mirror, system
priority; an `api` pod is not); one resource of a pod's requests (limits as default,
sidecars, init peak, pod-level, overhead). The full PodRequests table is in
tests/unit/syncloop/test_admission.py, where admission's fit check uses it.
"""

from __future__ import annotations

import pytest
from klet.model.pod import (
    CONFIG_MIRROR,
    CONFIG_SOURCE,
    config_source,
    is_critical,
    is_mirror,
    is_static,
    pod_requests,
)
from klet.model.types import JSON

MI = 1024**2
GI = 1024**3


def pod(*, annotations: dict[str, str] | None = None, priority: int | None = None) -> JSON:
    out: JSON = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}
    if annotations is not None:
        out["metadata"]["annotations"] = annotations
    if priority is not None:
        out["spec"]["priority"] = priority
    return out


@pytest.mark.parametrize(
    ("p", "source", "static"),
    [
        pytest.param(pod(), "api", False, id="no annotations"),
        pytest.param(pod(annotations={}), "api", False, id="no source annotation"),
        pytest.param(pod(annotations={CONFIG_SOURCE: ""}), "api", False, id="empty source"),
        pytest.param(pod(annotations={CONFIG_SOURCE: "api"}), "api", False, id="apiserver"),
        pytest.param(pod(annotations={CONFIG_SOURCE: "file"}), "file", True, id="file"),
        pytest.param(pod(annotations={CONFIG_SOURCE: "http"}), "http", True, id="http"),
        pytest.param(
            pod(annotations={CONFIG_SOURCE: "*"}), "*", True, id="any non-api source is static"
        ),
    ],
)
def test_source_and_static(p: JSON, source: str, static: bool) -> None:
    assert config_source(p) == source
    assert is_static(p) is static


@pytest.mark.parametrize(
    ("p", "mirror"),
    [
        (pod(), False),
        (pod(annotations={CONFIG_SOURCE: "api"}), False),
        (pod(annotations={CONFIG_MIRROR: "abc"}), True),
        (pod(annotations={CONFIG_MIRROR: ""}), True),
    ],
)
def test_mirror(p: JSON, mirror: bool) -> None:
    assert is_mirror(p) is mirror


@pytest.mark.parametrize(
    ("p", "critical"),
    [
        (pod(annotations={CONFIG_SOURCE: "api"}), False),
        (pod(annotations={}), False),
        (pod(annotations={CONFIG_SOURCE: "file"}), True),
        (pod(annotations={CONFIG_SOURCE: "http"}), True),
        (pod(annotations={CONFIG_MIRROR: "abc"}), True),
        (pod(priority=2_000_001_000), True),
        (pod(priority=2_000_000_000), True),
        (pod(priority=1_999_999_999), False),
    ],
)
def test_critical_pods(p: JSON, critical: bool) -> None:
    assert is_critical(p) is critical


@pytest.mark.parametrize(
    ("spec", "resource", "expected"),
    [
        ({"containers": [{"name": "a"}]}, "memory", 0),
        (
            {
                "containers": [
                    {"name": "a", "resources": {"requests": {"memory": "100Mi"}}},
                    {"name": "b", "resources": {"limits": {"memory": "50Mi"}}},
                ]
            },
            "memory",
            150 * MI,
        ),
        (
            {
                "containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}],
                "initContainers": [
                    {"name": "big", "resources": {"requests": {"memory": "1Gi"}}},
                ],
            },
            "memory",
            GI,
        ),
        (
            {
                "containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}],
                "initContainers": [
                    {
                        "name": "side",
                        "restartPolicy": "Always",
                        "resources": {"requests": {"memory": "20Mi"}},
                    },
                ],
                "overhead": {"memory": "5Mi"},
            },
            "memory",
            125 * MI,
        ),
        (
            {
                "containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}],
                "resources": {"requests": {"memory": "300Mi"}},
            },
            "memory",
            300 * MI,
        ),
        (
            {"containers": [{"name": "a", "resources": {"requests": {"ephemeral-storage": "1G"}}}]},
            "ephemeral-storage",
            10**9,
        ),
    ],
)
def test_one_resource_of_pod_requests(spec: JSON, resource: str, expected: int) -> None:
    assert pod_requests({"spec": spec}).get(resource, 0) == expected

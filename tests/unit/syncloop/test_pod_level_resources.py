"""Pod totals as Kubernetes 1.34 counts them: sidecars in the pod cgroup, pod-level
resources (`spec.resources`) in the QoS class, the pod cgroup and the containers'
limits, and the oom_score_adj rules for sidecars, node-critical pods and the pod-level
memory request (upstream's ResourceConfigForPod, ComputePodQOS, getCPULimit /
getMemoryLimit, GetContainerOOMScoreAdjust)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.model import pod as podmodel
from klet.syncloop.containers import podcgroups
from klet.syncloop.containers.syncsettings import SyncSettings
from klet.syncloop.environment import envvars
from klet.syncloop.environment.envvars import NodeFacts
from klet.syncloop.model import podspec, resources
from klet.syncloop.model.resources import NodeLimits, PodResources

GI = 1024**3
MI = 1024**2
NODE = NodeLimits(memory_capacity_bytes=4 * GI)


def c(
    name: str = "app",
    *,
    req: dict[str, str] | None = None,
    lim: dict[str, str] | None = None,
    sidecar: bool = False,
) -> Any:
    res: dict[str, Any] = {}
    if req is not None:
        res["requests"] = req
    if lim is not None:
        res["limits"] = lim
    out: dict[str, Any] = {"name": name, "image": "x", "resources": res}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(*containers: Any, init: tuple[Any, ...] = (), level: Any = None, **spec: Any) -> Any:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    if level is not None:
        body["resources"] = level
    return {"metadata": {"name": "p", "uid": "u"}, "spec": body}


APP = c(req={"cpu": "1", "memory": "200Mi"}, lim={"cpu": "1", "memory": "200Mi"})
SIDECAR = c(
    "mesh",
    req={"cpu": "500m", "memory": "100Mi"},
    lim={"cpu": "500m", "memory": "100Mi"},
    sidecar=True,
)


def test_a_sidecar_counts_in_the_pod_cgroup() -> None:
    """The issue's example: an app of 1 CPU / 200Mi and a native sidecar of 500m / 100Mi
    get a pod cgroup of 1.5 CPU / 300Mi (it was 1 CPU / 200Mi)."""
    p = pod(APP, init=(SIDECAR,))
    assert podspec.qos_class(p) == "Guaranteed"
    assert resources.pod_resources(p, NODE) == PodResources(1536, 150000, 100000, 300 * MI)


def test_an_init_container_counts_with_the_sidecars_started_before_it() -> None:
    """Init steps: a sidecar (500m/100Mi), then a plain init container of 2 CPU / 1Gi
    running beside it: the pod needs max(1.5 CPU, 2.5 CPU) and max(300Mi, 1Gi + 100Mi)."""
    big_init = c("setup", req={"cpu": "2", "memory": "1Gi"}, lim={"cpu": "2", "memory": "1Gi"})
    p = pod(APP, init=(SIDECAR, big_init))
    got = resources.pod_resources(p, NODE)
    assert (got.cpu_shares, got.cpu_quota, got.memory_limit_bytes) == (
        2560,
        250000,
        GI + 100 * MI,
    )


def test_a_sidecar_without_a_limit_leaves_the_burstable_pod_unlimited() -> None:
    """A Burstable pod's quota and memory limit are set only when every container (every
    init step) declares one; a sidecar without limits makes them unlimited."""
    loose = c("mesh", req={"cpu": "100m"}, sidecar=True)
    got = resources.pod_resources(pod(APP, init=(loose,)), NODE)
    assert (got.cpu_quota, got.memory_limit_bytes) == (None, None)
    assert got.cpu_shares == resources.milli_cpu_to_shares(1100)


@pytest.mark.parametrize(
    ("p", "qos"),
    [
        # Only pod-level limits: requests default to them, so Guaranteed (was BestEffort).
        (pod(c(), level={"limits": {"cpu": "1", "memory": "1Gi"}}), "Guaranteed"),
        # Pod-level limits on memory only: not Guaranteed.
        (pod(c(), level={"limits": {"memory": "1Gi"}}), "Burstable"),
        # Pod-level requests below the limits.
        (
            pod(c(), level={"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
            "Burstable",
        ),
        # Pod-level values decide even when a container alone would be Guaranteed.
        (
            pod(
                GUARANTEED := c(lim={"cpu": "1", "memory": "1Gi"}), level={"requests": {"cpu": "1"}}
            ),
            "Burstable",
        ),
        # Containers decide without pod-level resources; quantities compare by value.
        (
            pod(c(req={"cpu": "1000m", "memory": "1Gi"}, lim={"cpu": "1", "memory": "1024Mi"})),
            "Guaranteed",
        ),
        (pod(c(req={"cpu": "0"}, lim={"cpu": "0"})), "BestEffort"),
        (pod(GUARANTEED, c("b", req={"cpu": "1"})), "Burstable"),
        # The apiserver's class wins when the pod carries one.
        ({**pod(c()), "status": {"qosClass": "Burstable"}}, "Burstable"),
    ],
)
def test_the_qos_class(p: Any, qos: str) -> None:
    assert podspec.qos_class(p) == qos


def test_pod_level_limits_make_the_pod_cgroup() -> None:
    """spec.resources.limits alone (cpu 1, memory 1Gi): a Guaranteed pod cgroup of 1 CPU
    and 1Gi, the containers' own limits left out (the pod ran unlimited before)."""
    p = pod(c("a"), c("b"), level={"limits": {"cpu": "1", "memory": "1Gi"}})
    assert resources.pod_resources(p, NODE) == PodResources(1024, 100000, 100000, GI)


def test_pod_level_limits_cover_a_burstable_pod_whose_containers_declare_none() -> None:
    p = pod(
        c(req={"cpu": "100m"}), level={"requests": {"cpu": "200m"}, "limits": {"memory": "512Mi"}}
    )
    got = resources.pod_resources(p, NODE)
    assert podspec.qos_class(p) == "Burstable"
    assert (got.cpu_shares, got.cpu_quota, got.memory_limit_bytes) == (204, None, 512 * MI)


def test_a_container_without_limits_gets_the_pods() -> None:
    """upstream's getCPULimit/getMemoryLimit: the pod's limits in the container's own
    cgroup when it has none of its own; a container's own limit wins."""
    own = c("own", lim={"cpu": "250m", "memory": "64Mi"})
    p = pod(c("free"), own, level={"limits": {"cpu": "2", "memory": "1Gi"}})
    free = resources.container_resources(p, p["spec"]["containers"][0], NODE)
    assert (free.cpu_quota, free.memory_limit_bytes) == (200000, GI)
    mine = resources.container_resources(p, own, NODE)
    assert (mine.cpu_quota, mine.memory_limit_bytes) == (25000, 64 * MI)


def test_pod_level_huge_pages_reach_containers_that_name_none() -> None:
    node = NodeLimits(memory_capacity_bytes=4 * GI, hugepage_sizes=(2 * MI,))
    p = pod(c(), level={"limits": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "4Mi"}})
    got = resources.container_resources(p, p["spec"]["containers"][0], node)
    assert got.hugepage_limits == (("2MB", 4 * MI),)
    assert resources.pod_resources(p, node).hugepage_limits == (("2MB", 4 * MI),)


def test_pod_requests_with_pod_level_limits_only_default_to_them() -> None:
    p = pod(c(req={"cpu": "100m"}), level={"limits": {"cpu": "1", "memory": "1Gi"}})
    # cpu: the containers' aggregate (the apiserver's defaulting); memory: the limit.
    assert podmodel.pod_requests(p) == {"cpu": 100, "memory": GI}


def test_a_sidecars_oom_score_adj_is_never_above_the_least_regular_container() -> None:
    small = c("small", req={"memory": "64Mi"})
    big = c("big", req={"memory": "1Gi"})
    mesh = c("mesh", req={"memory": "16Mi"}, sidecar=True)
    p = pod(small, big, init=(mesh,))
    capacity = 4 * GI
    adj_small = resources.oom_score_adj(p, small, capacity)
    assert adj_small == 1000 - 1000 * 64 * MI // capacity
    assert resources.oom_score_adj(p, mesh, capacity) == adj_small


def test_a_node_critical_pod_gets_the_guaranteed_score() -> None:
    p = pod(
        c(req={"memory": "64Mi"}), priorityClassName="system-node-critical", priority=2000001000
    )
    assert resources.oom_score_adj(p, p["spec"]["containers"][0], 4 * GI) == -997


def test_the_pod_level_memory_request_left_over_is_shared_for_the_oom_score() -> None:
    """Pod-level memory request 1Gi, containers asking 128Mi and nothing: the remaining
    896Mi is shared by the two, 448Mi each, added to each container's own request."""
    a = c("a", req={"memory": "128Mi"})
    b = c("b")
    p = pod(a, b, level={"requests": {"memory": "1Gi"}})
    capacity = 4 * GI
    assert resources.oom_score_adj(p, a, capacity) == 1000 - 1000 * (576 * MI) // capacity
    assert resources.oom_score_adj(p, b, capacity) == 1000 - 1000 * (448 * MI) // capacity


@pytest.mark.parametrize(("oom_group", "unified"), [(True, {"memory.oom.group": "1"}), (False, {})])
def test_memory_oom_group_on_cgroup_v2(oom_group: bool, unified: dict[str, str]) -> None:
    node = NodeLimits(memory_capacity_bytes=4 * GI, oom_group=oom_group)
    assert resources.container_resources(pod(APP), APP, node).unified == unified


@pytest.mark.parametrize(
    ("version", "single", "oom_group"),
    [(2, None, True), (2, True, False), (1, None, False), (1, True, False)],
)
def test_node_limits_ask_for_oom_group_only_on_v2_without_single_process_kill(
    monkeypatch: pytest.MonkeyPatch, version: int, single: bool | None, oom_group: bool
) -> None:
    """upstream's kubelet: singleProcessOOMKill unset is false on cgroup v2 (group kill),
    true on v1 (which has no memory.oom.group)."""
    monkeypatch.setattr(podcgroups, "_detected", lambda: (4 * GI, -1000, (), "", version))
    limits = podcgroups.node_limits(SyncSettings(Path("/x"), single_process_oom_kill=single))
    assert limits.oom_group is oom_group


def test_the_downward_api_gives_a_container_without_limits_the_pods() -> None:
    p = pod(c(), level={"limits": {"cpu": "2", "memory": "1Gi"}})
    container = p["spec"]["containers"][0]
    node = NodeFacts(cpu_millis=8000, memory_bytes=16 * GI)

    def ref(resource: str) -> str | None:
        return envvars.resource_field_ref(container, {"resource": resource}, node, pod=p)

    assert (ref("limits.cpu"), ref("limits.memory")) == ("2", str(GI))
    # Without pod-level limits, the node's.
    assert (
        envvars.resource_field_ref(container, {"resource": "limits.cpu"}, node, pod=pod(c())) == "8"
    )

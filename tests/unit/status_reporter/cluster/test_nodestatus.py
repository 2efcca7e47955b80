"""The Node object and status as pure functions: labels (defaults, then --node-labels),
addresses, images (largest first, capped, 5 names), the four conditions with upstream's
reasons and messages (runtime down / not ready / network not ready / a service's Ready
contribution; pressure from the eviction service's contributions), transition times
kept while the status holds, change detection that ignores heartbeats and fields we do
not own, the report-frequency rule, registration and adoption patches."""

from __future__ import annotations

import pytest
from klet.model.records import NodeConditionRecord
from klet.model.types import JSON
from klet.status_reporter.cluster import nodestatus as ns
from klet.status_reporter.cluster.capacity import MachineInfo
from klet.status_reporter.cluster.nodestatus import (
    Image,
    NodeConfig,
    Observations,
    RuntimeState,
)

GI = 1024**3
MACHINE = MachineInfo(
    cpus=2,
    memory_bytes=4 * GI,
    ephemeral_storage_bytes=50 * GI,
    machine_id="m-1",
    system_uuid="u-1",
    boot_id="b-1",
    kernel_version="6.1.0",
    os_image="Test OS",
    architecture="arm64",
)
READY_RUNTIME = RuntimeState(
    reachable=True,
    conditions={"RuntimeReady": (True, "", ""), "NetworkReady": (True, "", "")},
    version="containerd://2.0.0",
    images=(Image(("busybox:1",), 10),),
)
CFG = NodeConfig(node_name="node1", node_labels={"team": "a", "kubernetes.io/os": "weird"})


def obs(
    runtime: RuntimeState = READY_RUNTIME, **contributions: NodeConditionRecord
) -> Observations:
    return Observations(
        machine=MACHINE,
        node_ips=("10.0.0.5",),
        runtime=runtime,
        contributions={k.replace("__", ":"): v for k, v in contributions.items()},
    )


def cond(type_: str, status: str, reason: str = "", message: str = "") -> NodeConditionRecord:
    return NodeConditionRecord(type=type_, status=status, at=1.0, reason=reason, message=message)


def by_type(status: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in status["conditions"]}


def test_labels_defaults_then_flag() -> None:
    labels = ns.node_labels(CFG, MACHINE)
    assert labels["kubernetes.io/hostname"] == "node1"
    assert labels["kubernetes.io/arch"] == labels["beta.kubernetes.io/arch"] == "arm64"
    assert labels["beta.kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/os"] == "weird"  # --node-labels win, as upstream
    assert labels["team"] == "a"


def test_addresses_internal_ips_then_hostname() -> None:
    assert ns.node_addresses(["10.0.0.5", "fd00::5"], "node1") == [
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "InternalIP", "address": "fd00::5"},
        {"type": "Hostname", "address": "node1"},
    ]


def test_images_largest_first_capped_five_names() -> None:
    images = [
        Image(("small:1",), 1),
        Image(tuple(f"big:{i}" for i in range(7)), 100),
        Image((), 1000),  # nameless: left out
        Image(("mid@sha256:x", "mid:1"), 50),
    ]
    got = ns.node_images(images, 2)
    assert got == [
        {"names": ["big:0", "big:1", "big:2", "big:3", "big:4"], "sizeBytes": 100},
        {"names": ["mid@sha256:x", "mid:1"], "sizeBytes": 50},
    ]
    assert len(ns.node_images(images, -1)) == 3
    assert ns.node_images(images, 0) == []


@pytest.mark.parametrize(
    ("runtime", "contributions", "status", "message"),
    [
        (READY_RUNTIME, {}, "True", "kubelet is posting ready status"),
        (RuntimeState(reachable=False), {}, "False", "container runtime is down"),
        (
            RuntimeState(
                reachable=True,
                conditions={
                    "RuntimeReady": (False, "Broken", "oops"),
                    "NetworkReady": (True, "", ""),
                },
            ),
            {},
            "False",
            "container runtime not ready: RuntimeReady=false reason:Broken message:oops",
        ),
        (
            RuntimeState(
                reachable=True,
                conditions={
                    "RuntimeReady": (True, "", ""),
                    "NetworkReady": (False, "NetworkPluginNotReady", "cni plugin not initialized"),
                },
            ),
            {},
            "False",
            "container runtime network not ready: NetworkReady=false "
            "reason:NetworkPluginNotReady message:cni plugin not initialized",
        ),
        (
            READY_RUNTIME,
            {"syncloop:Ready": cond("Ready", "False", message="PLEG is not healthy: stuck")},
            "False",
            "PLEG is not healthy: stuck",
        ),
        (
            READY_RUNTIME,
            {"syncloop:Ready": cond("Ready", "True")},
            "True",
            "kubelet is posting ready status",
        ),
        (
            RuntimeState(
                reachable=True,
                conditions={"RuntimeReady": (True, "", ""), "NetworkReady": (False, "N", "m")},
            ),
            {"syncloop:Ready": cond("Ready", "False", message="PLEG is not healthy: x")},
            "False",
            "[PLEG is not healthy: x, container runtime network not ready: "
            "NetworkReady=false reason:N message:m]",
        ),
    ],
)
def test_ready_condition(
    runtime: RuntimeState,
    contributions: dict[str, NodeConditionRecord],
    status: str,
    message: str,
) -> None:
    observations = Observations(
        machine=MACHINE, node_ips=("10.0.0.5",), runtime=runtime, contributions=contributions
    )
    ready = [s for s in ns.condition_states(observations) if s.type == "Ready"][0]
    assert (ready.status, ready.message) == (status, message)
    assert ready.reason == ("KubeletReady" if status == "True" else "KubeletNotReady")


def test_pressure_conditions_default_and_contributed() -> None:
    states = {s.type: s for s in ns.condition_states(obs())}
    assert [s for s in states] == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    assert (states["MemoryPressure"].status, states["MemoryPressure"].reason) == (
        "False",
        "KubeletHasSufficientMemory",
    )
    assert states["DiskPressure"].message == "kubelet has no disk pressure"
    assert states["PIDPressure"].reason == "KubeletHasSufficientPID"

    states = {
        s.type: s
        for s in ns.condition_states(
            obs(
                eviction__MemoryPressure=cond("MemoryPressure", "True"),
                eviction__DiskPressure=cond("DiskPressure", "True", "Custom", "disk is full"),
                eviction__PIDPressure=cond("PIDPressure", "False"),
                npd__KernelDeadlock=cond("KernelDeadlock", "True", "Stuck", "deadlock"),
            )
        )
    }
    assert (states["MemoryPressure"].status, states["MemoryPressure"].reason) == (
        "True",
        "KubeletHasInsufficientMemory",
    )
    assert (states["DiskPressure"].reason, states["DiskPressure"].message) == (
        "Custom",
        "disk is full",
    )
    assert states["PIDPressure"].status == "False"
    assert states["KernelDeadlock"].status == "True"  # other contributed types pass through
    assert states["Ready"].status == "True"  # pressure does not make the node NotReady


def test_transition_time_kept_while_status_holds() -> None:
    first = ns.node_status(CFG, obs(), existing=None, now=1000.0)
    ready = by_type(first)["Ready"]
    assert ready["lastTransitionTime"] == ready["lastHeartbeatTime"] == "1970-01-01T00:16:40Z"

    second = ns.node_status(CFG, obs(), existing=first, now=2000.0)
    ready = by_type(second)["Ready"]
    assert ready["lastTransitionTime"] == "1970-01-01T00:16:40Z"
    assert ready["lastHeartbeatTime"] == "1970-01-01T00:33:20Z"

    third = ns.node_status(CFG, obs(RuntimeState(reachable=False)), existing=second, now=3000.0)
    assert by_type(third)["Ready"]["lastTransitionTime"] == "1970-01-01T00:50:00Z"
    assert ns.transitions(second["conditions"], third["conditions"]) == [("Ready", "False")]


def test_status_fields() -> None:
    status = ns.node_status(CFG, obs(), existing=None, now=0.0)
    assert status["capacity"]["cpu"] == "2"
    assert status["allocatable"]["pods"] == "110"
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    assert status["nodeInfo"] == {
        "machineID": "m-1",
        "systemUUID": "u-1",
        "bootID": "b-1",
        "kernelVersion": "6.1.0",
        "osImage": "Test OS",
        "containerRuntimeVersion": "containerd://2.0.0",
        "kubeletVersion": ns.KUBELET_VERSION,
        "operatingSystem": "linux",
        "architecture": "arm64",
    }
    assert status["images"] == [{"names": ["busybox:1"], "sizeBytes": 10}]


def test_runtime_away_keeps_version_and_images() -> None:
    first = ns.node_status(CFG, obs(), existing=None, now=0.0)
    away = ns.node_status(CFG, obs(RuntimeState(reachable=False)), existing=first, now=10.0)
    assert away["images"] == first["images"]
    assert away["nodeInfo"]["containerRuntimeVersion"] == "containerd://2.0.0"


def test_status_changed_ignores_heartbeats_and_foreign_fields() -> None:
    first = ns.node_status(CFG, obs(), existing=None, now=1000.0)
    assert ns.status_changed(None, first)
    assert not ns.status_changed(first, first)
    second = ns.node_status(CFG, obs(), existing=first, now=1010.0)
    assert not ns.status_changed(first, second)  # only heartbeats moved

    server = dict(first)
    server["capacity"] = {**first["capacity"], "example.com/gpu": "1"}
    server["conditions"] = [*first["conditions"], {"type": "NetworkUnavailable", "status": "False"}]
    assert not ns.status_changed(server, second)

    pressured = ns.node_status(
        CFG, obs(e__MemoryPressure=cond("MemoryPressure", "True")), existing=first, now=1020.0
    )
    assert ns.status_changed(first, pressured)
    fewer_images = dict(second)
    fewer_images["images"] = []
    assert ns.status_changed(first, fewer_images)


@pytest.mark.parametrize(
    ("changed", "last", "now", "want"),
    [
        (True, 100.0, 101.0, True),
        (False, None, 0.0, True),
        (False, 100.0, 399.0, False),
        (False, 100.0, 400.0, True),
    ],
)
def test_needs_report(changed: bool, last: float | None, now: float, want: bool) -> None:
    assert ns.needs_report(changed=changed, last_report=last, now=now, report_frequency=300) is want


def test_initial_node() -> None:
    cfg = NodeConfig(
        node_name="node1",
        register_with_taints=({"key": "dedicated", "value": "x", "effect": "NoSchedule"},),
        provider_id="klet://node1",
    )
    node = ns.initial_node(cfg, obs(), now=0.0)
    assert node["kind"] == "Node"
    assert node["metadata"]["name"] == "node1"
    assert node["metadata"]["annotations"] == {ns.CMAD_ANNOTATION: "true"}
    assert node["spec"] == {
        "taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}],
        "providerID": "klet://node1",
    }
    assert by_type(node["status"])["Ready"]["status"] == "True"
    no_cmad = ns.initial_node(
        NodeConfig(node_name="n", controller_attach_detach=False), obs(), now=0
    )
    assert "annotations" not in no_cmad["metadata"]


def test_reconcile_existing() -> None:
    initial = ns.initial_node(CFG, obs(), now=0.0)
    same = {
        "metadata": {
            "labels": dict(initial["metadata"]["labels"]),
            "annotations": {ns.CMAD_ANNOTATION: "true"},
        }
    }
    assert ns.reconcile_existing(initial, same) is None

    stale: JSON = {
        "metadata": {
            "labels": {"kubernetes.io/hostname": "old", "kubernetes.io/arch": "arm64", "x": "y"},
            "annotations": {},
        }
    }
    patch = ns.reconcile_existing(initial, stale)
    assert patch is not None
    labels = patch["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "node1"
    assert "kubernetes.io/arch" not in labels  # already right
    assert "x" not in labels and "team" not in labels  # --node-labels: at creation only
    assert patch["metadata"]["annotations"] == {ns.CMAD_ANNOTATION: "true"}

    no_cmad = ns.initial_node(
        NodeConfig(node_name="node1", controller_attach_detach=False), obs(), now=0.0
    )
    removing = ns.reconcile_existing(
        no_cmad,
        {
            "metadata": {
                "labels": no_cmad["metadata"]["labels"],
                "annotations": {ns.CMAD_ANNOTATION: "true"},
            }
        },
    )
    assert removing == {"metadata": {"annotations": {ns.CMAD_ANNOTATION: None}}}


def test_status_patch_replaces_addresses() -> None:
    status = ns.node_status(CFG, obs(), existing=None, now=0.0)
    patch = ns.status_patch(status)
    assert patch["status"]["addresses"][0] == {"$patch": "replace"}
    assert patch["status"]["addresses"][1:] == status["addresses"]
    assert patch["status"]["conditions"] == status["conditions"]
    assert "$patch" not in str(status)  # the status itself is untouched


def test_external_cloud_provider_registers_tainted_uninitialized() -> None:
    """--cloud-provider=external, as upstream's initialNode: the uninitialized taint after
    registerWithTaints, and --node-ip handed to the cloud controller as an annotation."""
    cfg = NodeConfig(
        node_name="node1",
        register_with_taints=({"key": "dedicated", "value": "x", "effect": "NoSchedule"},),
        provider_id="aws:///eu-west-1a/i-1",
        external_cloud_provider=True,
        given_node_ips=("10.0.0.5", "fd00::5"),
    )
    node = ns.initial_node(cfg, obs(), now=0.0)
    assert node["spec"]["taints"] == [
        {"key": "dedicated", "value": "x", "effect": "NoSchedule"},
        {
            "key": "node.cloudprovider.kubernetes.io/uninitialized",
            "value": "true",
            "effect": "NoSchedule",
        },
    ]
    assert node["spec"]["providerID"] == "aws:///eu-west-1a/i-1"
    assert node["metadata"]["annotations"] == {
        ns.CMAD_ANNOTATION: "true",
        "alpha.kubernetes.io/provided-node-ip": "10.0.0.5,fd00::5",
    }
    # without --node-ip: no annotation, and the Hostname alone until the CCM sets addresses
    bare = NodeConfig(node_name="node1", external_cloud_provider=True)
    node = ns.initial_node(bare, obs(), now=0.0)
    assert node["metadata"]["annotations"] == {ns.CMAD_ANNOTATION: "true"}
    assert node["status"]["addresses"] == [{"type": "Hostname", "address": "node1"}]
    # no cloud provider: no taint of its own
    assert "taints" not in ns.initial_node(NodeConfig(node_name="n"), obs(), now=0)["spec"]


def test_external_cloud_provider_leaves_addresses_to_the_cloud_controller() -> None:
    cfg = NodeConfig(node_name="node1", external_cloud_provider=True)
    ccm = [
        {"type": "InternalIP", "address": "172.31.0.9"},
        {"type": "ExternalIP", "address": "54.1.2.3"},
        {"type": "Hostname", "address": "ip-172-31-0-9"},
    ]
    status = ns.node_status(cfg, obs(), existing={"addresses": ccm}, now=0.0)
    assert status["addresses"] == ccm
    assert ns.status_patch(status)["status"]["addresses"] == [{"$patch": "replace"}, *ccm]
    # before the CCM has set any: with --node-ip given, the node's own (upstream: the
    # administrator's addresses, which the CCM may replace)
    given = NodeConfig(
        node_name="node1", external_cloud_provider=True, given_node_ips=("10.0.0.5",)
    )
    assert ns.node_status(given, obs(), existing={}, now=0.0)["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "Hostname", "address": "node1"},
    ]
    # without a cloud provider klet's addresses replace whatever the Node had
    plain = ns.node_status(NodeConfig(node_name="node1"), obs(), existing={"addresses": ccm}, now=0)
    assert plain["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "Hostname", "address": "node1"},
    ]

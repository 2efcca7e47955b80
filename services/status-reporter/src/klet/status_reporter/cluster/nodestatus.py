"""The Node object and its status, as pure functions of configuration and observations.

Restates the upstream kubelet's node status setters (`pkg/kubelet/nodestatus`) and
registration rules (`kubelet_node_status.go`):

- `initial_node`: what registration POSTs: name, default labels (`kubernetes.io/hostname`,
  `kubernetes.io/os`, `kubernetes.io/arch` and their `beta.` twins) then --node-labels
  (theirs win), the controller-managed attach/detach annotation, registerWithTaints,
  providerID, and a full status;
- `reconcile_existing`: when the Node already exists, upstream only brings the default
  labels and the attach/detach annotation in line; --node-labels and taints are applied
  at creation only (NodeRestriction forbids a node to change its own taints anyway);
- `node_status`: capacity/allocatable (`capacity.py`), addresses (InternalIP per node IP,
  then Hostname), daemonEndpoints, nodeInfo, images (largest first, at most
  nodeStatusMaxImages, at most 5 names each, digests before tags), and the conditions
  MemoryPressure, DiskPressure, PIDPressure, Ready, plus any other condition a service
  contributed through the `node` table;
- `status_changed` / `needs_report`: PATCH only when something other than heartbeat
  times changed, or nodeStatusReportFrequency passed since the last report.

With `--cloud-provider=external` (`NodeConfig.external_cloud_provider`), as upstream:
registration adds the `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule`
taint (the cloud controller manager removes it once it has initialized the Node) and,
when --node-ip is given, the `alpha.kubernetes.io/provided-node-ip` annotation; the
addresses are the cloud controller's: once the Node has any, klet reports them as they
are, and before that only the Hostname unless --node-ip names the addresses.

Ready is False (reason `KubeletNotReady`, upstream's messages, several joined as
"[a, b]") when the runtime is unreachable, the runtime's RuntimeReady or NetworkReady
condition is false, or a service contributed a `Ready` condition that is not "True"
(how syncloop reports an unhealthy PLEG: its `Ready`, read as `syncloop:Ready`). A pressure
condition is True when any contribution of its type says "True"; the contribution's
reason/message replace upstream's defaults only when given.

kubeletVersion is `KUBELET_VERSION`: the upstream release whose behaviour and API klet
follows (`KUBERNETES_VERSION`, which `--version` names too) with a `-klet` pre-release
suffix, so `kubectl get nodes` tells a klet node from an upstream one while
version-skew checks still see 1.34.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from klet.config.gatelist import KUBERNETES_VERSION
from klet.model import node as nodemodel
from klet.model.node import DEFAULT_LABELS, MachineInfo
from klet.model.records import NodeConditionRecord
from klet.model.timestamps import rfc3339
from klet.model.types import JSON
from klet.status_reporter.cluster.capacity import allocatable, capacity

KUBELET_VERSION = f"{KUBERNETES_VERSION}-klet"
CMAD_ANNOTATION = "volumes.kubernetes.io/controller-managed-attach-detach"
# k8s.io/cloud-provider/api: TaintExternalCloudProvider, AnnotationAlphaProvidedIPAddr
UNINITIALIZED_TAINT: Mapping[str, str] = {
    "key": "node.cloudprovider.kubernetes.io/uninitialized",
    "value": "true",
    "effect": "NoSchedule",
}
PROVIDED_NODE_IP_ANNOTATION = "alpha.kubernetes.io/provided-node-ip"
MAX_NAMES_PER_IMAGE = 5

READY = "Ready"
NOT_READY_REASON = "KubeletNotReady"


@dataclass(frozen=True)
class PressureCondition:
    """Upstream's wording of one pressure condition in each state."""

    type: str
    false_reason: str
    false_message: str
    true_reason: str
    true_message: str


PRESSURE_CONDITIONS = (
    PressureCondition(
        "MemoryPressure",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
        "KubeletHasInsufficientMemory",
        "kubelet has insufficient memory available",
    ),
    PressureCondition(
        "DiskPressure",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
        "KubeletHasDiskPressure",
        "kubelet has disk pressure",
    ),
    PressureCondition(
        "PIDPressure",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
        "KubeletHasInsufficientPID",
        "kubelet has insufficient PID available",
    ),
)
OWN_CONDITIONS = frozenset([*(p.type for p in PRESSURE_CONDITIONS), READY])

# Upstream's Node events on a condition transition: (type, status) → event reason.
TRANSITION_EVENTS = {
    ("Ready", "True"): "NodeReady",
    ("Ready", "False"): "NodeNotReady",
    ("MemoryPressure", "False"): "NodeHasSufficientMemory",
    ("MemoryPressure", "True"): "NodeHasInsufficientMemory",
    ("DiskPressure", "False"): "NodeHasNoDiskPressure",
    ("DiskPressure", "True"): "NodeHasDiskPressure",
    ("PIDPressure", "False"): "NodeHasSufficientPID",
    ("PIDPressure", "True"): "NodeHasInsufficientPID",
}


@dataclass(frozen=True)
class NodeConfig:
    """The configuration the Node object is built from (read once from settings)."""

    node_name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    register_with_taints: tuple[Mapping[str, Any], ...] = ()
    provider_id: str = ""
    # --cloud-provider=external: the uninitialized taint, addresses left to the CCM
    external_cloud_provider: bool = False
    given_node_ips: tuple[str, ...] = ()
    """--node-ip as given (() = not given, the node's IPs were detected)."""
    kubelet_port: int = 10250
    max_pods: int = 110
    max_images: int = 50
    """nodeStatusMaxImages; -1 = no cap."""
    kube_reserved: Mapping[str, str] = field(default_factory=dict)
    system_reserved: Mapping[str, str] = field(default_factory=dict)
    eviction_hard: Mapping[str, str] = field(default_factory=dict)
    controller_attach_detach: bool = True


@dataclass(frozen=True)
class Image:
    """One image as the runtime lists it."""

    names: tuple[str, ...]
    """Repo digests first, then repo tags (upstream's order)."""
    size: int


@dataclass(frozen=True)
class RuntimeState:
    """What the CRI runtime said on the last query."""

    reachable: bool
    """Status() answered."""
    conditions: Mapping[str, tuple[bool, str, str]] = field(default_factory=dict)
    """Runtime condition type → (status, reason, message)."""
    version: str = ""
    """containerRuntimeVersion, `<runtime name>://<runtime version>`; "" if unknown."""
    images: tuple[Image, ...] | None = None
    """None: not listed this time (the last reported list is kept)."""


@dataclass(frozen=True)
class Observations:
    """Everything the status is computed from, gathered by the node manager."""

    machine: MachineInfo
    node_ips: tuple[str, ...]
    runtime: RuntimeState
    contributions: Mapping[str, NodeConditionRecord] = field(default_factory=dict)
    volumes_in_use: tuple[str, ...] | None = None
    """Unique names of the volumes pods use (the bus `volumes` table); None: unknown."""
    devices: Mapping[str, tuple[int, int]] | None = None
    """Device plugin resource -> (capacity, allocatable) (the bus `devices` table);
    None: unknown, none added (the Node keeps its own)."""


@dataclass(frozen=True)
class ConditionState:
    type: str
    status: str
    reason: str
    message: str


# -- labels, addresses, images --------------------------------------------------------


def node_labels(cfg: NodeConfig, machine: MachineInfo) -> dict[str, str]:
    """Default labels, then --node-labels on top (shared with syncloop's admission)."""
    return nodemodel.node_labels(cfg.node_name, machine, cfg.node_labels)


def node_addresses(node_ips: Sequence[str], hostname: str) -> list[JSON]:
    out: list[JSON] = [{"type": "InternalIP", "address": ip} for ip in node_ips]
    out.append({"type": "Hostname", "address": hostname})
    return out


def node_images(images: Iterable[Image], max_images: int) -> list[JSON]:
    """Largest first, capped at `max_images` (-1: all), at most 5 names each; images
    without any name are left out (the apiserver refuses a nameless entry)."""
    ranked = sorted((i for i in images if i.names), key=lambda i: (-i.size, i.names))
    if max_images >= 0:
        ranked = ranked[:max_images]
    return [{"names": list(i.names[:MAX_NAMES_PER_IMAGE]), "sizeBytes": i.size} for i in ranked]


# -- conditions -------------------------------------------------------------------------


def _runtime_condition_error(kind: str, cond: tuple[bool, str, str] | None, what: str) -> str:
    if cond is None:
        return f"{what}: {kind}=false reason: message:{kind} condition not reported"
    return f"{what}: {kind}=false reason:{cond[1]} message:{cond[2]}"


def not_ready_reasons(obs: Observations) -> list[str]:
    """Why the node is not ready, in upstream's order and wording; empty when ready."""
    errors: list[str] = []
    runtime = obs.runtime
    if not runtime.reachable:
        errors.append("container runtime is down")
    else:
        ready = runtime.conditions.get("RuntimeReady")
        if ready is None or not ready[0]:
            errors.append(
                _runtime_condition_error("RuntimeReady", ready, "container runtime not ready")
            )
    for key in sorted(obs.contributions):
        rec = obs.contributions[key]
        if rec.type == READY and rec.status != "True":
            errors.append(rec.message or rec.reason or f"{key.split(':', 1)[0]} is not ready")
    if runtime.reachable:
        network = runtime.conditions.get("NetworkReady")
        if network is None or not network[0]:
            errors.append(
                _runtime_condition_error(
                    "NetworkReady", network, "container runtime network not ready"
                )
            )
    return errors


def _aggregate(errors: Sequence[str]) -> str:
    return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"


_SEVERITY = {"True": 2, "Unknown": 1, "False": 0}


def condition_states(obs: Observations) -> list[ConditionState]:
    """The desired state of every condition (without times), in upstream's order."""
    by_type: dict[str, list[NodeConditionRecord]] = {}
    for key in sorted(obs.contributions):
        rec = obs.contributions[key]
        by_type.setdefault(rec.type, []).append(rec)

    states: list[ConditionState] = []
    for p in PRESSURE_CONDITIONS:
        pressing = [r for r in by_type.get(p.type, []) if r.status == "True"]
        if pressing:
            first = pressing[0]
            states.append(
                ConditionState(
                    p.type, "True", first.reason or p.true_reason, first.message or p.true_message
                )
            )
        else:
            states.append(ConditionState(p.type, "False", p.false_reason, p.false_message))

    errors = not_ready_reasons(obs)
    if errors:
        states.append(ConditionState(READY, "False", NOT_READY_REASON, _aggregate(errors)))
    else:
        states.append(
            ConditionState(READY, "True", "KubeletReady", "kubelet is posting ready status")
        )

    for type_ in sorted(set(by_type) - OWN_CONDITIONS):
        worst = max(by_type[type_], key=lambda r: _SEVERITY.get(r.status, 1))
        states.append(ConditionState(type_, worst.status, worst.reason, worst.message))
    return states


def node_conditions(
    existing: Sequence[JSON], states: Sequence[ConditionState], now: float
) -> list[JSON]:
    """The conditions to report: heartbeat now; transition time kept unless the status
    changed (or the condition is new)."""
    previous = {c.get("type"): c for c in existing if isinstance(c, dict)}
    stamp = rfc3339(now)
    out: list[JSON] = []
    for s in states:
        old = previous.get(s.type)
        transition = (
            old["lastTransitionTime"]
            if old is not None and old.get("status") == s.status and old.get("lastTransitionTime")
            else stamp
        )
        out.append(
            {
                "type": s.type,
                "status": s.status,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": transition,
                "reason": s.reason,
                "message": s.message,
            }
        )
    return out


def transitions(existing: Sequence[JSON], new: Sequence[JSON]) -> list[tuple[str, str]]:
    """(type, new status) of every condition whose status changed or that is new."""
    previous = {c.get("type"): c.get("status") for c in existing if isinstance(c, dict)}
    return [(c["type"], c["status"]) for c in new if previous.get(c["type"]) != c["status"]]


# -- status and node --------------------------------------------------------------------


def node_status(cfg: NodeConfig, obs: Observations, *, existing: JSON | None, now: float) -> JSON:
    """The full status to report, given the Node's current status (None: new Node)."""
    machine = obs.machine
    node_info = {
        "machineID": machine.machine_id,
        "systemUUID": machine.system_uuid,
        "bootID": machine.boot_id,
        "kernelVersion": machine.kernel_version,
        "osImage": machine.os_image,
        "containerRuntimeVersion": obs.runtime.version,
        "kubeletVersion": KUBELET_VERSION,
        "operatingSystem": machine.operating_system,
        "architecture": machine.architecture,
    }
    if not obs.runtime.version and existing:
        # Keep the last known runtime version while the runtime is away.
        known = (existing.get("nodeInfo") or {}).get("containerRuntimeVersion", "")
        node_info["containerRuntimeVersion"] = known
    if obs.runtime.images is not None:
        images = node_images(obs.runtime.images, cfg.max_images)
    else:
        # A runtime that did not answer lists no images; that is not "the node has none".
        images = list((existing or {}).get("images") or [])
    devices = dict(obs.devices or {})
    return {
        "capacity": {
            **capacity(machine, max_pods=cfg.max_pods),
            **{r: str(total) for r, (total, _) in devices.items()},
        },
        "allocatable": {
            **allocatable(
                machine,
                max_pods=cfg.max_pods,
                kube_reserved=cfg.kube_reserved,
                system_reserved=cfg.system_reserved,
                eviction_hard=cfg.eviction_hard,
            ),
            **{r: str(healthy) for r, (_, healthy) in devices.items()},
        },
        "conditions": node_conditions(
            (existing or {}).get("conditions") or [], condition_states(obs), now
        ),
        "addresses": _addresses(cfg, obs, existing),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": cfg.kubelet_port}},
        "nodeInfo": node_info,
        "images": images,
        # None (absent; the patch deletes it) when nothing is in use, as upstream omits
        # it; while unknown, what the Node says.
        "volumesInUse": (
            list(obs.volumes_in_use) or None
            if obs.volumes_in_use is not None
            else (existing or {}).get("volumesInUse")
        ),
    }


def _addresses(cfg: NodeConfig, obs: Observations, existing: JSON | None) -> list[JSON]:
    """Upstream's NodeAddress setter: with an external cloud provider the Node's own
    addresses stand once it has any; before that, the Hostname alone unless --node-ip
    was given."""
    if cfg.external_cloud_provider:
        have = (existing or {}).get("addresses") or []
        if have:
            return [dict(a) for a in have]
        if not cfg.given_node_ips:
            return [{"type": "Hostname", "address": cfg.node_name}]
    return node_addresses(obs.node_ips, cfg.node_name)


def initial_node(cfg: NodeConfig, obs: Observations, *, now: float) -> JSON:
    """The Node registration creates."""
    metadata: JSON = {"name": cfg.node_name, "labels": node_labels(cfg, obs.machine)}
    annotations: dict[str, str] = {}
    if cfg.controller_attach_detach:
        annotations[CMAD_ANNOTATION] = "true"
    if cfg.external_cloud_provider and cfg.given_node_ips:
        annotations[PROVIDED_NODE_IP_ANNOTATION] = ",".join(cfg.given_node_ips)
    if annotations:
        metadata["annotations"] = annotations
    spec: JSON = {}
    taints = [dict(t) for t in cfg.register_with_taints]
    if cfg.external_cloud_provider:
        taints.append(dict(UNINITIALIZED_TAINT))
    if taints:
        spec["taints"] = taints
    if cfg.provider_id:
        spec["providerID"] = cfg.provider_id
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": spec,
        "status": node_status(cfg, obs, existing=None, now=now),
    }


def reconcile_existing(initial: JSON, existing: JSON) -> JSON | None:
    """The merge patch that brings an existing Node in line on adoption, or None.

    Default labels take the values registration would set (a default label the new
    Node would not carry is left alone); the attach/detach annotation is added or
    removed to match.
    """
    want_labels = initial["metadata"].get("labels") or {}
    meta = existing.get("metadata") or {}
    have_labels = meta.get("labels") or {}
    labels: dict[str, str | None] = {}
    for key in DEFAULT_LABELS:
        if key in want_labels and have_labels.get(key) != want_labels[key]:
            labels[key] = want_labels[key] or None
    annotations: dict[str, str | None] = {}
    want_cmad = (initial["metadata"].get("annotations") or {}).get(CMAD_ANNOTATION)
    have_cmad = (meta.get("annotations") or {}).get(CMAD_ANNOTATION)
    if want_cmad != have_cmad:
        annotations[CMAD_ANNOTATION] = want_cmad
    if not labels and not annotations:
        return None
    patch_meta: JSON = {}
    if labels:
        patch_meta["labels"] = labels
    if annotations:
        patch_meta["annotations"] = annotations
    return {"metadata": patch_meta}


def _without_heartbeat(conditions: Iterable[Any]) -> dict[str, JSON]:
    return {
        str(c.get("type")): {k: v for k, v in c.items() if k != "lastHeartbeatTime"}
        for c in conditions
        if isinstance(c, dict)
    }


def status_changed(existing: JSON | None, new: JSON) -> bool:
    """Whether reporting `new` would change the Node's status, heartbeat times aside.

    Only what we report is compared: a capacity key or condition another component
    maintains (device plugins, NetworkUnavailable) is not ours to notice.
    """
    if not existing:
        return True
    for key, value in new.items():
        have = existing.get(key)
        if key == "conditions":
            old = _without_heartbeat(have or [])
            for type_, cond in _without_heartbeat(value).items():
                if old.get(type_) != cond:
                    return True
        elif isinstance(value, dict):
            have = have or {}
            if any(have.get(k) != v for k, v in value.items()):
                return True
        elif have != value:
            return True
    return False


def needs_report(
    *, changed: bool, last_report: float | None, now: float, report_frequency: float
) -> bool:
    """Upstream's rule: report on change, else once per nodeStatusReportFrequency."""
    if changed or last_report is None:
        return True
    return now - last_report >= report_frequency


def status_patch(status: JSON) -> JSON:
    """The strategic merge patch of nodes/<name>/status that reports `status`.

    Conditions merge by type, so conditions other components own survive. Addresses
    also have `type` as merge key, which cannot express two InternalIPs (dual stack)
    or a changed address list; the `$patch: replace` directive makes the list ours.
    """
    body = dict(status)
    body["addresses"] = [{"$patch": "replace"}, *status["addresses"]]
    return {"status": body}

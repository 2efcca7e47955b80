"""generateAPIPodStatus: the API PodStatus of one pod, as a pure function.

Phase, conditions and container statuses are derived from the desired pod, what the
runtime has, and why containers wait (back-off, image pulls); the previous status is
passed in so transition times and startTime are kept when nothing changed, as
upstream's status manager does. Times come in as arguments.

`observedGeneration` (PodObservedGenerationTracking, on by default in v1.34, the only
value klet accepts): the status, and each condition the kubelet owns, carry the pod's
`metadata.generation` this status was computed from, as upstream's generateAPIPodStatus
and status manager set them. The status's never goes back (upstream keeps the old one
when it is higher). A pod without a generation (a static pod: the apiserver never saw
it) gets none, so a mirror pod's status carries none either, as upstream's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.timestamps import rfc3339
from klet.model.types import JSON
from klet.syncloop.containers import termination
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod, restart_count_of
from klet.syncloop.probing.proberesults import NO_PROBES, ProbeKind, ProbeResults


@dataclass(frozen=True)
class ResizeView:
    """In-place resize as the status shows it (pods/resizing.py gives it): the
    PodResizePending/PodResizeInProgress conditions, and per resizable container its
    allocated resources and those last applied to its running instance."""

    conditions: tuple[JSON, ...] = ()
    actuated: Mapping[str, JSON] | None = None


def _resize_fields(status: JSON, spec: JSON, resize: ResizeView) -> None:
    """upstream's allocatedResources (the allocated requests: `spec` is the container
    as allocated) and resources (the allocated ones; for a running container, what was
    applied to it, as containerd 1.6 reports no resources in ContainerStatus): limits
    and requests only, as upstream's status (a container's DRA `claims` are no status)."""
    allocated: JSON = spec.get("resources") or {}
    requests = allocated.get("requests")
    if requests:
        status["allocatedResources"] = dict(requests)
    shown = allocated
    if "running" in status["state"]:
        shown = (resize.actuated or {}).get(status["name"]) or allocated
    status["resources"] = {
        k: dict(v) for k, v in shown.items() if v and k in ("limits", "requests")
    }


DISRUPTION_TARGET = "DisruptionTarget"
TERMINATION_BY_KUBELET = "TerminationByKubelet"
RESIZE_CONDITIONS = frozenset({"PodResizePending", "PodResizeInProgress"})


def _ns(ns: int) -> str | None:
    return rfc3339(ns / 1e9) if ns > 0 else None


def _terminated(c: ContainerStatusInfo, runtime_type: str) -> JSON:
    reason = c.reason or ("Completed" if c.exit_code == 0 else "Error")
    out: JSON = {
        "exitCode": c.exit_code,
        "reason": reason,
        "startedAt": _ns(c.started_at),
        "finishedAt": _ns(c.finished_at),
        "containerID": f"{runtime_type}://{c.id}",
    }
    if c.message:
        out["message"] = c.message
    return out


def _started(spec: JSON, c: ContainerStatusInfo, probes: ProbeResults) -> bool:
    """A running container counts as started once its startup probe (if any) succeeded."""
    if not spec.get("startupProbe"):
        return True
    return probes.result(ProbeKind.STARTUP, c.id) is True


def _ready(spec: JSON, c: ContainerStatusInfo, probes: ProbeResults) -> bool:
    """A started container is ready without a readiness probe, else once it succeeded."""
    if not spec.get("readinessProbe"):
        return True
    return probes.result(ProbeKind.READINESS, c.id) is True


def container_status(
    spec: JSON,
    instances: list[ContainerStatusInfo],
    waiting: tuple[str, str] | None,
    runtime_type: str,
    *,
    default_reason: str = "ContainerCreating",
    init: bool = False,
    probes: ProbeResults = NO_PROBES,
) -> JSON:
    """One entry of containerStatuses or initContainerStatuses.

    `ready` follows upstream's prober: a running container (a sidecar too) is ready
    once started and its readiness probe, if any, succeeded; a plain init container is
    ready once it exited 0. `default_reason` is the waiting reason of a container
    that has not been created yet (PodInitializing while init containers run).
    """
    name = spec["name"]
    plain_init = init and not podspec.is_sidecar(spec)
    latest = instances[0] if instances else None
    status: JSON = {
        "name": name,
        "image": spec.get("image", ""),
        "imageID": "",
        "restartCount": 0,
        "ready": False,
        "started": False,
        "state": {},
        "lastState": {},
    }
    if latest is None:
        reason, message = waiting or (default_reason, "")
        status["state"] = {"waiting": _waiting(reason, message)}
        return status
    status["restartCount"] = restart_count_of(latest)
    status["imageID"] = latest.image_ref
    status["containerID"] = f"{runtime_type}://{latest.id}"
    previous = next((c for c in instances[1:] if c.state == ContainerState.EXITED), None)
    if latest.state == ContainerState.RUNNING:
        status["state"] = {"running": {"startedAt": _ns(latest.started_at)}}
        status["started"] = _started(spec, latest, probes)
        status["ready"] = not plain_init and status["started"] and _ready(spec, latest, probes)
        if previous is not None:
            status["lastState"] = {"terminated": _terminated(previous, runtime_type)}
    elif latest.state == ContainerState.EXITED:
        if waiting is not None:
            status["state"] = {"waiting": _waiting(*waiting)}
            status["lastState"] = {"terminated": _terminated(latest, runtime_type)}
        else:
            status["state"] = {"terminated": _terminated(latest, runtime_type)}
            status["ready"] = plain_init and latest.exit_code == 0
            if previous is not None:
                status["lastState"] = {"terminated": _terminated(previous, runtime_type)}
    else:  # created or unknown: not started yet, or the runtime lost track
        reason, message = waiting or (default_reason, "")
        status["state"] = {"waiting": _waiting(reason, message)}
        if previous is not None:
            status["lastState"] = {"terminated": _terminated(previous, runtime_type)}
    return status


def _ephemeral(status: JSON) -> JSON:
    """An ephemeral container's status: never ready (it serves nothing) and, without
    probes, no started flag, as upstream leaves both to the prober it does not have."""
    status["ready"] = False
    del status["started"]
    return status


def _waiting(reason: str, message: str) -> JSON:
    out: JSON = {"reason": reason}
    if message:
        out["message"] = message
    return out


def _last_exit(status: JSON) -> int | None:
    """The exit code of the state, or of the last state while waiting to restart."""
    term = status["state"].get("terminated") or status.get("lastState", {}).get("terminated")
    return None if term is None else int(term["exitCode"])


def pod_phase(pod: JSON, statuses: list[JSON], init_statuses: list[JSON] | None = None) -> str:
    """upstream getPhase, init containers and sidecars included."""
    policy = podspec.restart_policy(pod)
    by_name = {s["name"]: s for s in init_statuses or []}
    pending_init = failed_init = pending_sidecars = 0
    running = waiting = stopped = succeeded = unknown = 0
    for c in podspec.init_containers(pod):
        s = by_name.get(c["name"])
        if podspec.is_sidecar(c):
            # Stopped sidecars do not count for the phase; one not yet started does.
            if s is None:
                unknown += 1
            elif "running" in s["state"]:
                running += 1
                pending_sidecars += 0 if s.get("started") else 1
            elif "waiting" in s["state"] and "terminated" not in s.get("lastState", {}):
                pending_sidecars += 1
                waiting += 1
            continue
        if s is None or "running" in s["state"]:
            pending_init += 1
        elif "terminated" in s["state"] or "terminated" in s.get("lastState", {}):
            failed_init += 1 if _last_exit(s) != 0 else 0
        else:
            pending_init += 1
    for s in statuses:
        state = s["state"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            if state["terminated"]["exitCode"] == 0:
                succeeded += 1
        elif "waiting" in state:
            if "terminated" in s.get("lastState", {}):
                stopped += 1
            else:
                waiting += 1
        else:
            unknown += 1
    if failed_init > 0 and policy == "Never":
        return "Failed"
    if pending_init > 0 or pending_sidecars > 0 or waiting > 0:
        return "Pending"
    if running > 0 and unknown == 0:
        return "Running"
    if running == 0 and stopped > 0 and unknown == 0:
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def initialized_condition(
    pod: JSON, statuses: list[JSON], init_statuses: list[JSON]
) -> tuple[bool, str]:
    """upstream GeneratePodInitializedCondition: (initialized, message when not)."""
    by_name = {s["name"]: s for s in init_statuses}
    incomplete = []
    for c in podspec.init_containers(pod):
        s = by_name.get(c["name"])
        if s is None:
            incomplete.append(c["name"])
        elif podspec.is_sidecar(c):
            if not s.get("started"):
                incomplete.append(c["name"])
        elif (s["state"].get("terminated") or {}).get("exitCode", 1) != 0:
            incomplete.append(c["name"])
    if not incomplete:
        return True, ""
    # A regular container that ran means initialization finished before (sidecars may
    # be restarting now).
    if any("running" in s["state"] or "terminated" in s["state"] for s in statuses):
        return True, ""
    return False, f"containers with incomplete status: [{' '.join(incomplete)}]"


def generation(pod: JSON) -> int:
    """The pod's `metadata.generation`, 0 when it has none (static pods)."""
    value = podspec.meta(pod).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def observed_generation(pod: JSON, previous: JSON) -> int:
    """status.observedGeneration: the pod's generation, never lower than the one
    already published (upstream's status manager keeps the old one when higher)."""
    before = previous.get("observedGeneration")
    old = before if isinstance(before, int) and not isinstance(before, bool) else 0
    return max(generation(pod), old)


def _condition(
    type_: str, ok: bool, previous: dict[str, JSON], now: float, reason: str = ""
) -> JSON:
    status = "True" if ok else "False"
    before = previous.get(type_)
    when = before.get("lastTransitionTime") if before and before.get("status") == status else None
    cond: JSON = {
        "type": type_,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": when or rfc3339(now),
    }
    if reason and not ok:
        cond["reason"] = reason
    return cond


READINESS_GATES_NOT_READY = "ReadinessGatesNotReady"


def unready_gates(pod: JSON) -> str | None:
    """Why the pod's readiness gates keep it from being Ready (upstream's message), or
    None when every gate's condition is True. The conditions are those of the pod as the
    apiserver has it: other controllers set them on the pod's status."""
    gates = [g for g in (pod.get("spec") or {}).get("readinessGates") or [] if g]
    if not gates:
        return None
    conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or [] if c}
    problems = []
    for gate in gates:
        kind = str(gate.get("conditionType", ""))
        cond = conditions.get(kind)
        if cond is None:
            problems.append(
                f'corresponding condition of pod readiness gate "{kind}" does not exist.'
            )
        elif cond.get("status") != "True":
            problems.append(
                f'the status of pod readiness gate "{kind}" is not "True", but {cond.get("status")}'
            )
    return ", ".join(problems) or None


def compute_pod_status(
    pod: JSON,
    runtime: RuntimePod,
    *,
    waiting: dict[str, tuple[str, str]],
    previous: JSON | None,
    now: float,
    runtime_type: str = "containerd",
    host_ip: str = "",
    terminal: tuple[str, str] | None = None,
    stopping: bool = False,
    probes: ProbeResults = NO_PROBES,
    disruption: str | None = None,
    resize: ResizeView | None = None,
) -> JSON:
    """The PodStatus JSON.

    `stopping` marks a pod that is being stopped for good (deleted, or killed by
    request): nothing restarts, so once no container runs its phase is final —
    Succeeded when every container exited 0, else Failed (upstream's podIsTerminal).
    `terminal` (reason, message) additionally forces Failed with that reason.
    `disruption`, the message of an eviction, adds the DisruptionTarget condition.
    """
    prev = previous or {}
    inits = podspec.init_containers(pod)
    default_reason = "PodInitializing" if inits else "ContainerCreating"

    def one(c: JSON, *, init: bool) -> JSON:
        out = container_status(
            c,
            runtime.instances(c["name"]),
            waiting.get(c["name"]),
            runtime_type,
            default_reason=default_reason,
            init=init,
            probes=probes,
        )
        if resize is not None:
            _resize_fields(out, c, resize)
        return out

    init_statuses = [one(c, init=True) for c in inits]
    statuses = [one(c, init=False) for c in podspec.containers(pod)]
    ephemeral_statuses = [_ephemeral(one(c, init=False)) for c in podspec.ephemeral_containers(pod)]
    termination.trim_pod_messages(pod, init_statuses + statuses)
    phase = pod_phase(pod, statuses, init_statuses)
    if stopping and not any("running" in s["state"] for s in statuses):
        exited = [
            s["state"].get("terminated") or s["lastState"].get("terminated") for s in statuses
        ]
        ran = [t for t in exited if t]
        if ran:
            phase = (
                "Succeeded"
                if all(t["exitCode"] == 0 for t in ran) and len(ran) == len(statuses)
                else "Failed"
            )
    if terminal is not None:
        phase = "Failed"
        for s in init_statuses + statuses:
            s["ready"] = False
    sandbox = runtime.latest_sandbox()
    sandbox_ready = sandbox is not None and sandbox.state == SandboxState.READY
    # Sidecars count towards readiness like regular containers.
    readiness = [
        s for c, s in zip(inits, init_statuses, strict=True) if podspec.is_sidecar(c)
    ] + statuses
    all_ready = bool(statuses) and all(s["ready"] for s in readiness)
    initialized, init_message = initialized_condition(pod, statuses, init_statuses)
    prev_conditions: dict[str, JSON] = {
        c["type"]: c for c in prev.get("conditions", []) if "type" in c
    }
    not_ready = [s["name"] for s in readiness if not s["ready"]]
    terminal_phase = phase in ("Succeeded", "Failed")
    reason = "PodCompleted" if terminal_phase else "ContainersNotReady"
    init_cond = _condition(
        "Initialized",
        initialized or phase == "Succeeded",
        prev_conditions,
        now,
        "ContainersNotInitialized",
    )
    if not initialized and phase != "Succeeded":
        init_cond["message"] = init_message
    elif phase == "Succeeded" and inits:
        init_cond["reason"] = "PodCompleted"
    # Ready also waits for the readiness gates, once the containers are ready.
    gates = unready_gates(pod) if all_ready else None
    ready_cond = _condition(
        "Ready",
        all_ready and gates is None,
        prev_conditions,
        now,
        READINESS_GATES_NOT_READY if gates is not None else reason,
    )
    if gates is not None:
        ready_cond["message"] = gates
    # upstream appends the resize conditions before its own (none once terminal).
    resizing = list(resize.conditions) if resize is not None and not terminal_phase else []
    conditions = [
        *resizing,
        _condition("PodReadyToStartContainers", sandbox_ready, prev_conditions, now),
        init_cond,
        ready_cond,
        _condition("ContainersReady", all_ready, prev_conditions, now, reason),
        _condition("PodScheduled", True, prev_conditions, now),
    ]
    if disruption is not None:
        # upstream's eviction adds DisruptionTarget (reason TerminationByKubelet) with
        # the eviction message; it is appended after the kubelet-owned conditions.
        target = _condition(DISRUPTION_TARGET, True, prev_conditions, now)
        target["reason"] = TERMINATION_BY_KUBELET
        target["message"] = disruption
        conditions.append(target)
    gen = generation(pod)
    for cond in conditions:
        # upstream sets each generated condition's observedGeneration to the pod's
        # generation; DisruptionTarget is made once (at the eviction) and copied from
        # the old status after, so it keeps the generation it was made at.
        before = prev_conditions.get(cond["type"]) or {}
        if cond["type"] in RESIZE_CONDITIONS:
            continue  # they carry the generation of the resize they describe
        if cond["type"] == DISRUPTION_TARGET and before.get("observedGeneration"):
            cond["observedGeneration"] = before["observedGeneration"]
        elif gen:
            cond["observedGeneration"] = gen
    for cond in conditions:
        if (
            cond["type"] in ("Ready", "ContainersReady")
            and cond["status"] == "False"
            and not terminal_phase
            and not all_ready
        ):
            cond["message"] = f"containers with unready status: [{' '.join(not_ready)}]"
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "startTime": prev.get("startTime") or rfc3339(now),
    }
    observed = observed_generation(pod, prev)
    if observed:
        status["observedGeneration"] = observed
    if inits:
        status["initContainerStatuses"] = init_statuses
    status["containerStatuses"] = statuses
    if ephemeral_statuses:
        status["ephemeralContainerStatuses"] = ephemeral_statuses
    status["qosClass"] = podspec.qos_class(pod)
    if host_ip:
        status["hostIPs"] = [{"ip": host_ip}]
    if pod.get("spec", {}).get("hostNetwork") and host_ip:
        # A host-network pod's IPs are the node's (upstream reports the host IPs).
        status["podIP"] = host_ip
        status["podIPs"] = [{"ip": host_ip}]
    elif sandbox is not None and sandbox.ip:
        status["podIP"] = sandbox.ip
        status["podIPs"] = [{"ip": ip} for ip in (sandbox.ip, *sandbox.ips)]
    elif prev.get("podIP"):
        # A stopped sandbox has no IP any more; upstream keeps the last known ones.
        status["podIP"] = prev["podIP"]
        status["podIPs"] = prev.get("podIPs") or [{"ip": prev["podIP"]}]
    if terminal is not None:
        status["reason"], status["message"] = terminal
    return status


def strip_volatile(status: JSON) -> Any:
    """The status without fields that change on their own, for change detection."""
    return {k: v for k, v in status.items() if k != "startTime"}

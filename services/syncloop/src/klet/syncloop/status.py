"""generateAPIPodStatus: the API PodStatus of one pod, as a pure function.

Phase, conditions and container statuses are derived from the desired pod, what the
runtime has, and why containers wait (back-off, image pulls); the previous status is
passed in so transition times and startTime are kept when nothing changed, as
upstream's status manager does. Times come in as arguments.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.types import JSON
from klet.syncloop import podspec
from klet.syncloop.runtimepod import RuntimePod, restart_count_of


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def container_status(
    spec: JSON,
    instances: list[ContainerStatusInfo],
    waiting: tuple[str, str] | None,
    runtime_type: str,
) -> JSON:
    name = spec["name"]
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
        reason, message = waiting or ("ContainerCreating", "")
        status["state"] = {"waiting": _waiting(reason, message)}
        return status
    status["restartCount"] = restart_count_of(latest)
    status["imageID"] = latest.image_ref
    status["containerID"] = f"{runtime_type}://{latest.id}"
    previous = next((c for c in instances[1:] if c.state == ContainerState.EXITED), None)
    if latest.state == ContainerState.RUNNING:
        status["state"] = {"running": {"startedAt": _ns(latest.started_at)}}
        status["ready"] = True
        status["started"] = True
        if previous is not None:
            status["lastState"] = {"terminated": _terminated(previous, runtime_type)}
    elif latest.state == ContainerState.EXITED:
        if waiting is not None:
            status["state"] = {"waiting": _waiting(*waiting)}
            status["lastState"] = {"terminated": _terminated(latest, runtime_type)}
        else:
            status["state"] = {"terminated": _terminated(latest, runtime_type)}
            if previous is not None:
                status["lastState"] = {"terminated": _terminated(previous, runtime_type)}
    else:  # created or unknown: not started yet, or the runtime lost track
        reason, message = waiting or ("ContainerCreating", "")
        status["state"] = {"waiting": _waiting(reason, message)}
        if previous is not None:
            status["lastState"] = {"terminated": _terminated(previous, runtime_type)}
    return status


def _waiting(reason: str, message: str) -> JSON:
    out: JSON = {"reason": reason}
    if message:
        out["message"] = message
    return out


def pod_phase(pod: JSON, statuses: list[JSON]) -> str:
    """upstream getPhase for regular containers."""
    policy = podspec.restart_policy(pod)
    running = waiting = stopped = succeeded = 0
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
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


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
) -> JSON:
    """The PodStatus JSON.

    `stopping` marks a pod that is being stopped for good (deleted, or killed by
    request): nothing restarts, so once no container runs its phase is final —
    Succeeded when every container exited 0, else Failed (upstream's podIsTerminal).
    `terminal` (reason, message) additionally forces Failed with that reason.
    """
    prev = previous or {}
    statuses = [
        container_status(c, runtime.instances(c["name"]), waiting.get(c["name"]), runtime_type)
        for c in podspec.containers(pod)
    ]
    phase = pod_phase(pod, statuses)
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
        for s in statuses:
            s["ready"] = False
    sandbox = runtime.latest_sandbox()
    sandbox_ready = sandbox is not None and sandbox.state == SandboxState.READY
    all_ready = bool(statuses) and all(s["ready"] for s in statuses)
    prev_conditions: dict[str, JSON] = {
        c["type"]: c for c in prev.get("conditions", []) if "type" in c
    }
    not_ready = [s["name"] for s in statuses if not s["ready"]]
    reason = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
    conditions = [
        _condition("PodReadyToStartContainers", sandbox_ready, prev_conditions, now),
        _condition("Initialized", True, prev_conditions, now),
        _condition("Ready", all_ready, prev_conditions, now, reason),
        _condition("ContainersReady", all_ready, prev_conditions, now, reason),
        _condition("PodScheduled", True, prev_conditions, now),
    ]
    for cond in conditions:
        if (
            cond["type"] in ("Ready", "ContainersReady")
            and cond["status"] == "False"
            and phase not in ("Succeeded", "Failed")
        ):
            cond["message"] = f"containers with unready status: [{' '.join(not_ready)}]"
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "startTime": prev.get("startTime") or rfc3339(now),
        "containerStatuses": statuses,
        "qosClass": podspec.qos_class(pod),
    }
    if host_ip:
        status["hostIPs"] = [{"ip": host_ip}]
    if sandbox is not None and sandbox.ip:
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

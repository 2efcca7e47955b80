"""computePodActions: what to do for one pod, as a pure function (upstream kuberuntime).

From the desired pod, what the runtime has, the crash-loop back-off and the latest
probe results it returns the actions the executor (syncpod.py) performs through CRI.
The rules follow upstream:

- No usable sandbox (none, not ready, or lost its IP) → kill what is left and create a
  new one. A pod with init containers starts again from the first one (the old init
  containers are purged so they cannot count as done); otherwise every container starts
  again — except under restartPolicy Never once a sandbox has already run containers,
  and except succeeded containers under OnFailure.
- Init containers run one at a time, in order, each to success before the next. A
  failed one is retried (with back-off) unless the pod's policy is Never, in which case
  the pod is killed. Init containers with `restartPolicy: Always` are sidecars: once
  started (and past their startup probe) the next one starts, and they are kept running
  — restarted when they exit, fail liveness or startup, or their spec changes.
- Regular containers are looked at only once initialization is done. A running one
  whose spec hash changed is restarted whatever the policy; one that failed its
  liveness or startup probe is killed and restarted unless the policy is Never.
- A container in an unknown state is killed before it is restarted.
- An exited container restarts per policy, but not before its back-off has elapsed;
  while it waits it is reported as CrashLoopBackOff and the worker is woken when the
  wait ends.
- Nothing running and nothing to start → kill the pod (its sandbox and sidecars stop).
- Ephemeral (debug) containers start once each in the existing sandbox: one the
  runtime has never run is started (even while init containers run); one that ran is
  never started again, whatever its exit. They neither keep a pod alive nor start in a
  new sandbox, and changing them changes no other container's hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.flowcontrol import Backoff
from klet.model.types import JSON, ContainerID
from klet.syncloop.model import podspec
from klet.syncloop.model.runtimepod import RuntimePod, hash_of
from klet.syncloop.probing.proberesults import NO_PROBES, ProbeKind, ProbeResults

# upstream's containerKillReason values, carried to the Killing event and metrics
KILL_LIVENESS = "LivenessProbe"
KILL_STARTUP = "StartupProbe"
KILL_UNKNOWN = "Unknown"


@dataclass(frozen=True)
class StartAction:
    name: str
    reason: str
    backoff_key: str | None = None  # advance this back-off key when started


@dataclass(frozen=True)
class KillAction:
    name: str
    message: str
    reason: str = ""  # "", LivenessProbe, StartupProbe or Unknown
    grace_s: int | None = None  # a probe's terminationGracePeriodSeconds, when set


@dataclass
class PodActions:
    kill_pod: bool = False
    create_sandbox: bool = False
    sandbox_attempt: int = 0
    purge_init: bool = False  # remove the old sandbox's init containers first
    init_to_start: list[StartAction] = field(default_factory=list)  # in spec order
    to_start: list[StartAction] = field(default_factory=list)
    ephemeral_to_start: list[StartAction] = field(default_factory=list)  # in spec order
    to_kill: dict[ContainerID, KillAction] = field(default_factory=dict)
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (reason, message)
    wake_at: float | None = None  # when a back-off ends

    def wake(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)


def should_restart(container_status: ContainerStatusInfo | None, restart_policy: str) -> bool:
    """upstream ShouldContainerBeRestarted for a container that is not running."""
    if container_status is None:
        return True
    if container_status.state == ContainerState.RUNNING:
        return False
    if container_status.state in (ContainerState.UNKNOWN, ContainerState.CREATED):
        return True
    if restart_policy == "Never":
        return False
    if restart_policy == "OnFailure" and container_status.exit_code == 0:
        return False
    return True


def init_failed(status: ContainerStatusInfo) -> bool:
    """upstream isInitContainerFailed: OOM-killed, exited non-zero, or lost."""
    if "OOMKilled" in status.reason:
        return True
    if status.state == ContainerState.EXITED and status.exit_code != 0:
        return True
    return status.state == ContainerState.UNKNOWN


def sandbox_changed(pod: JSON, runtime: RuntimePod) -> tuple[bool, int]:
    """(needs a new sandbox, its attempt number)."""
    latest = runtime.latest_sandbox()
    if latest is None:
        return True, 0
    host_network = bool(pod.get("spec", {}).get("hostNetwork"))
    ready = [s for s in runtime.sandboxes if s.state == SandboxState.READY]
    if len(ready) > 1 or latest.state != SandboxState.READY:
        return True, latest.attempt + 1
    if not host_network and not latest.ip:
        return True, latest.attempt + 1
    return False, latest.attempt


def _seconds(ns: int) -> float:
    return ns / 1e9


def _start_after_backoff(
    actions: PodActions,
    pod: JSON,
    container: JSON,
    last: ContainerStatusInfo | None,
    backoff: Backoff,
    now: float,
    reason: str,
) -> StartAction | None:
    """The start of `container`, or None while it waits out its crash-loop back-off
    (the waiting state and the wake-up are recorded on `actions`).

    A restart (`last` is an earlier instance) advances the back-off when it goes ahead.
    """
    name = container.get("name", "")
    key = podspec.backoff_key(pod, container)
    if last is None or last.state != ContainerState.EXITED:
        return StartAction(name, reason, backoff_key=key if last is not None else None)
    finished = _seconds(last.finished_at) or now
    if backoff.in_backoff_since(key, finished, now):
        delay = backoff.delay(key, now)
        pod_name = podspec.meta(pod).get("name", "")
        uid = podspec.meta(pod).get("uid", "")
        actions.waiting[name] = (
            "CrashLoopBackOff",
            f"back-off {int(delay)}s restarting failed container={name} pod={pod_name}_"
            f"{podspec.meta(pod).get('namespace', 'default')}({uid})",
        )
        actions.wake(finished + delay)
        return None
    return StartAction(name, reason, backoff_key=key)


def _probe_grace(container: JSON, probe_field: str) -> int | None:
    value = (container.get(probe_field) or {}).get("terminationGracePeriodSeconds")
    return None if value is None else int(value)


def compute_pod_actions(
    pod: JSON,
    runtime: RuntimePod,
    backoff: Backoff,
    now: float,
    probes: ProbeResults = NO_PROBES,
) -> PodActions:
    policy = podspec.restart_policy(pod)
    actions = PodActions()
    changed, attempt = sandbox_changed(pod, runtime)
    if changed:
        _new_sandbox(actions, pod, runtime, policy, attempt)
        return actions

    initialized = _init_actions(actions, pod, runtime, backoff, now, probes)
    if actions.kill_pod:
        return actions
    actions.ephemeral_to_start = [
        StartAction(c["name"], "ephemeral container added")
        for c in podspec.ephemeral_containers(pod)
        if runtime.latest(c["name"]) is None
    ]
    if not initialized:
        return actions

    keep = 0
    for c in podspec.containers(pod):
        name = c["name"]
        last = runtime.latest(name)
        if last is not None and last.state == ContainerState.RUNNING:
            decided = _running_container_kill(c, last, policy, probes)
            if decided is None:
                keep += 1
                continue
            kill, restart = decided
            actions.to_kill[last.id] = kill
            if restart is not None:
                actions.to_start.append(restart)
            continue
        if last is not None and last.state == ContainerState.UNKNOWN:
            actions.to_kill[last.id] = KillAction(
                name,
                'Container is in "UNKNOWN" state, try killing it before restart',
                KILL_UNKNOWN,
            )
        if not should_restart(last, policy):
            continue
        start = _start_after_backoff(actions, pod, c, last, backoff, now, "not running")
        if start is None:
            keep += 1  # a container waiting out its back-off keeps the pod alive
            continue
        actions.to_start.append(start)

    if keep == 0 and not actions.to_start:
        actions.kill_pod = True
        actions.init_to_start.clear()  # sidecars alone do not keep a pod alive
        actions.ephemeral_to_start.clear()  # nor do ephemeral containers
    return actions


def _new_sandbox(
    actions: PodActions, pod: JSON, runtime: RuntimePod, policy: str, attempt: int
) -> None:
    actions.kill_pod = runtime.latest_sandbox() is not None or bool(runtime.running())
    actions.sandbox_attempt = attempt
    if policy == "Never" and attempt > 0 and runtime.containers:
        # A Never pod whose sandbox died after its containers ran stays as it is.
        return
    to_start: list[StartAction] = []
    for c in podspec.containers(pod):
        last = runtime.latest(c["name"])
        exited = last is not None and last.state == ContainerState.EXITED
        if exited and policy == "OnFailure" and last is not None and last.exit_code == 0:
            continue
        if exited and policy == "Never":
            continue
        to_start.append(StartAction(c["name"], "sandbox (re)created"))
    if not to_start:
        return  # every container is done; nothing to host
    actions.create_sandbox = True
    inits = podspec.init_containers(pod)
    if inits:
        # Initialization starts over in the new sandbox, from the first init container.
        actions.purge_init = True
        actions.init_to_start = [StartAction(inits[0]["name"], "sandbox (re)created")]
        return
    actions.to_start = to_start


def _running_container_kill(
    container: JSON, last: ContainerStatusInfo, policy: str, probes: ProbeResults
) -> tuple[KillAction, StartAction | None] | None:
    """A running regular container to kill: (the kill, its restart when it starts again);
    None to keep it."""
    name = container["name"]
    if hash_of(last) != podspec.container_hash(container):
        # A changed spec restarts the container whatever the policy.
        message = f"Container {name} definition changed, will be restarted"
        return KillAction(name, message), StartAction(name, message)
    if probes.result(ProbeKind.LIVENESS, last.id) is False:
        message, reason = f"Container {name} failed liveness probe", KILL_LIVENESS
        grace = _probe_grace(container, "livenessProbe")
    elif probes.result(ProbeKind.STARTUP, last.id) is False:
        message, reason = f"Container {name} failed startup probe", KILL_STARTUP
        grace = _probe_grace(container, "startupProbe")
    else:
        return None
    if policy == "Never":
        return KillAction(name, message, reason, grace), None
    message += ", will be restarted"
    return KillAction(name, message, reason, grace), StartAction(name, message)


def _any_regular_created(pod: JSON, runtime: RuntimePod) -> bool:
    for c in podspec.containers(pod):
        last = runtime.latest(c["name"])
        if last is not None and last.state in (ContainerState.CREATED, ContainerState.RUNNING):
            return True
    return False


def _init_actions(
    actions: PodActions,
    pod: JSON,
    runtime: RuntimePod,
    backoff: Backoff,
    now: float,
    probes: ProbeResults,
) -> bool:
    """upstream computeInitContainerActions; returns whether the pod is initialized.

    The init containers are walked from the last to the first: completed ones may have
    been removed from the runtime, so the furthest one that ran tells how far
    initialization got. Sidecars before it are kept running.
    """
    inits = podspec.init_containers(pod)
    if not inits:
        return True
    initialized = _any_regular_created(pod, runtime)
    previously_initialized = initialized
    restart_on_failure = podspec.restart_policy(pod) != "Never"
    starts: list[StartAction] = []  # collected backwards, reversed at the end

    def start(index: int, reason: str, last: ContainerStatusInfo | None) -> None:
        action = _start_after_backoff(actions, pod, inits[index], last, backoff, now, reason)
        if action is not None:
            starts.append(action)

    for i in range(len(inits) - 1, -1, -1):
        c = inits[i]
        name = c["name"]
        sidecar = podspec.is_sidecar(c)
        last = runtime.latest(name)
        if last is None:
            # Gone from the runtime after initialization: a sidecar must come back.
            if previously_initialized and sidecar:
                start(i, "sidecar not running", None)
            continue
        if previously_initialized and not sidecar:
            continue  # after initialization only sidecars are kept running

        if last.state == ContainerState.CREATED:
            # Created but never started (the runtime failed to start it): start anew.
            start(i, "created but not started", last)
        elif last.state == ContainerState.RUNNING:
            if sidecar:
                started, restart = _sidecar_running(actions, c, last, probes)
                if started:
                    if i == len(inits) - 1:
                        initialized = True
                    elif not previously_initialized:
                        starts.append(StartAction(inits[i + 1]["name"], "previous sidecar started"))
                if restart is not None:
                    starts.append(restart)
            # a running plain init container: wait for it to finish
        elif last.state == ContainerState.EXITED:
            if sidecar:
                start(i, "sidecar exited", last)
            elif init_failed(last):
                if not restart_on_failure:
                    actions.kill_pod = True
                    actions.init_to_start = []
                    return False
                start(i, "init container failed", last)
            elif i == len(inits) - 1:
                initialized = True
            else:
                starts.append(StartAction(inits[i + 1]["name"], "previous init container done"))
        else:  # unknown: kill it before starting it again
            if not sidecar and not restart_on_failure:
                actions.kill_pod = True
                actions.init_to_start = []
                return False
            actions.to_kill[last.id] = KillAction(
                name,
                'Init container is in "UNKNOWN" state, try killing it before restart',
                KILL_UNKNOWN,
            )
            start(i, "unknown state", last)
        previously_initialized = True

    if not previously_initialized:
        starts.append(StartAction(inits[0]["name"], "first init container"))
    seen: set[str] = set()
    for s in reversed(starts):
        if s.name not in seen:
            seen.add(s.name)
            actions.init_to_start.append(s)
    return initialized


def _sidecar_running(
    actions: PodActions, container: JSON, last: ContainerStatusInfo, probes: ProbeResults
) -> tuple[bool, StartAction | None]:
    """A running sidecar: (counts as started, the restart to do if it must be killed).

    It counts as started once its startup probe (if any) succeeded; only then may the
    next init container start. The kills it needs are recorded on `actions`.
    """
    name = container["name"]
    if container.get("startupProbe"):
        startup = probes.result(ProbeKind.STARTUP, last.id)
        if startup is None:
            return False, None  # the next init container waits for the startup probe
        if startup is False:
            actions.to_kill[last.id] = KillAction(
                name,
                f"Init container {name} failed startup probe",
                KILL_STARTUP,
                _probe_grace(container, "startupProbe"),
            )
            return False, StartAction(name, "failed startup probe")
    if hash_of(last) != podspec.container_hash(container):
        actions.to_kill[last.id] = KillAction(name, f"Init container {name} definition changed")
        return True, StartAction(name, "spec hash changed")
    if container.get("livenessProbe") and probes.result(ProbeKind.LIVENESS, last.id) is False:
        actions.to_kill[last.id] = KillAction(
            name,
            f"Init container {name} failed liveness probe",
            KILL_LIVENESS,
            _probe_grace(container, "livenessProbe"),
        )
        return True, StartAction(name, "failed liveness probe")
    return True, None


def kill_order(
    pod: JSON | None, live: list[ContainerStatusInfo]
) -> list[list[ContainerStatusInfo]]:
    """Groups of containers to stop one group after the other (upstream's order).

    Regular containers (and any the spec does not name) first, all at once; then the
    sidecars one at a time, last declared first, so a sidecar outlives what uses it.
    """
    sidecars = [c["name"] for c in podspec.init_containers(pod or {}) if podspec.is_sidecar(c)]
    first = [c for c in live if c.name not in sidecars]
    groups = [first] if first else []
    for name in reversed(sidecars):
        group = [c for c in live if c.name == name]
        if group:
            groups.append(group)
    return groups

"""computePodActions: what to do for one pod, as a pure function (upstream kuberuntime).

From the desired pod, what the runtime has and the crash-loop back-off it returns the
actions the executor (syncpod.py) performs through CRI. The rules follow upstream:

- No usable sandbox (none, not ready, or lost its IP) → kill what is left and create a
  new one, starting every container again — except under restartPolicy Never once a
  sandbox has already run containers, and except succeeded containers under OnFailure.
- A running container whose spec hash changed is killed and started again whatever the
  restart policy (upstream behaviour, even under Never).
- A container in an unknown state is killed before it is restarted.
- An exited container restarts per policy, but not before its back-off has elapsed;
  while it waits it is reported as CrashLoopBackOff and the worker is woken when the
  wait ends.
- Nothing running and nothing to start → kill the pod (its sandbox stops).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klet.cri.types import ContainerState, ContainerStatusInfo, SandboxState
from klet.model.types import JSON, ContainerID
from klet.syncloop import podspec
from klet.syncloop.backoff import Backoff
from klet.syncloop.runtimepod import RuntimePod, hash_of


@dataclass(frozen=True)
class StartAction:
    name: str
    reason: str
    backoff_key: str | None = None  # advance this back-off key when started


@dataclass
class PodActions:
    kill_pod: bool = False
    create_sandbox: bool = False
    sandbox_attempt: int = 0
    to_start: list[StartAction] = field(default_factory=list)
    to_kill: dict[ContainerID, str] = field(default_factory=dict)  # id -> reason
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


def _check_backoff(
    actions: PodActions,
    pod: JSON,
    container: JSON,
    last: ContainerStatusInfo | None,
    backoff: Backoff,
    now: float,
) -> str | None:
    """None when the container may start now; sets waiting state otherwise.

    Returns the back-off key to advance when the start goes ahead.
    """
    key = podspec.backoff_key(pod, container)
    if last is None or last.state != ContainerState.EXITED:
        return key if last is not None else None
    finished = _seconds(last.finished_at) or now
    if backoff.in_backoff_since(key, finished, now):
        delay = backoff.delay(key, now)
        name = container.get("name", "")
        pod_name = podspec.meta(pod).get("name", "")
        uid = podspec.meta(pod).get("uid", "")
        actions.waiting[name] = (
            "CrashLoopBackOff",
            f"back-off {int(delay)}s restarting failed container={name} pod={pod_name}_"
            f"{podspec.meta(pod).get('namespace', 'default')}({uid})",
        )
        actions.wake(finished + delay)
        return "WAIT"
    return key


def compute_pod_actions(pod: JSON, runtime: RuntimePod, backoff: Backoff, now: float) -> PodActions:
    policy = podspec.restart_policy(pod)
    actions = PodActions()
    changed, attempt = sandbox_changed(pod, runtime)
    if changed:
        actions.kill_pod = runtime.latest_sandbox() is not None or bool(runtime.running())
        actions.sandbox_attempt = attempt
        if policy == "Never" and attempt > 0 and runtime.containers:
            # A Never pod whose sandbox died after its containers ran stays as it is.
            actions.create_sandbox = False
            return actions
        actions.create_sandbox = True
        for c in podspec.containers(pod):
            last = runtime.latest(c["name"])
            if (
                policy == "OnFailure"
                and last is not None
                and last.state == ContainerState.EXITED
                and last.exit_code == 0
            ):
                continue
            if policy == "Never" and last is not None and last.state == ContainerState.EXITED:
                continue
            actions.to_start.append(StartAction(c["name"], "sandbox (re)created"))
        if not actions.to_start:
            actions.create_sandbox = False  # every container is done; nothing to host
        return actions

    keep = 0
    for c in podspec.containers(pod):
        name = c["name"]
        last = runtime.latest(name)
        if last is not None and last.state == ContainerState.RUNNING:
            if hash_of(last) != podspec.container_hash(c):
                actions.to_kill[last.id] = f"Container {name} definition changed, will be restarted"
                actions.to_start.append(StartAction(name, "spec hash changed"))
            else:
                keep += 1
            continue
        if last is not None and last.state == ContainerState.UNKNOWN:
            actions.to_kill[last.id] = f"Container {name} is in unknown state, will be killed"
        if not should_restart(last, policy):
            continue
        key = _check_backoff(actions, pod, c, last, backoff, now)
        if key == "WAIT":
            keep += 1  # a container waiting out its back-off keeps the pod alive
            continue
        actions.to_start.append(StartAction(name, "not running", backoff_key=key))

    if keep == 0 and not actions.to_start:
        actions.kill_pod = True
    return actions

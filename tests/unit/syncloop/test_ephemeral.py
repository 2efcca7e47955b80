"""Ephemeral (debug) containers: started once each in the running pod's sandbox, never
restarted, no effect on the other containers; their status, and the PID namespace of
a targeted container."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb
from klet.cri import labels as L
from klet.cri.client import _container_pb
from klet.cri.types import ContainerState as CS
from klet.cri.types import NamespaceMode, SandboxState
from klet.model.flowcontrol import Backoff
from klet.syncloop.model import podspec
from klet.syncloop.pods.actions import compute_pod_actions
from klet.syncloop.pods.status import compute_pod_status

from .helpers import ctr, pod, runtime, sandbox
from .test_syncpod import World

IMAGE = "registry.klet.test/busybox:1.36"


def with_debugger(p: dict[str, Any], *names: str, **extra: Any) -> dict[str, Any]:
    """`p` after pods/ephemeralcontainers added `names` (the rest of the spec unchanged)."""
    out = copy.deepcopy(p)
    out["spec"]["ephemeralContainers"] = [
        {"name": n, "image": IMAGE, "command": ["sh"], "stdin": True, "tty": True, **extra}
        for n in names
    ]
    return out


def test_an_added_ephemeral_container_starts_once_and_nothing_else_changes() -> None:
    p = with_debugger(pod("app"), "debugger")
    rt = runtime([sandbox()], [ctr(p, "app", CS.RUNNING)])
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert [s.name for s in a.ephemeral_to_start] == ["debugger"]
    assert not a.kill_pod and not a.create_sandbox and not a.to_start and not a.to_kill


@pytest.mark.parametrize("state", [CS.RUNNING, CS.EXITED, CS.CREATED, CS.UNKNOWN])
@pytest.mark.parametrize("exit_code", [0, 1])
def test_an_ephemeral_container_that_ran_is_never_started_again(state: CS, exit_code: int) -> None:
    p = with_debugger(pod("app"), "debugger")
    rt = runtime(
        [sandbox()],
        [ctr(p, "app", CS.RUNNING), ctr(p, "debugger", state, exit_code=exit_code, finished_s=5)],
    )
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert not a.ephemeral_to_start and not a.to_start and not a.to_kill and not a.kill_pod


def test_ephemeral_containers_do_not_change_the_other_containers_hashes() -> None:
    before = pod("app", inits=({"name": "side", "restartPolicy": "Always"},))
    after = with_debugger(before, "debugger", "debugger2")
    for kind in ("containers", "initContainers"):
        for old, new in zip(before["spec"][kind], after["spec"][kind], strict=True):
            assert podspec.container_hash(old) == podspec.container_hash(new)
    # The running containers were started from `before`: none is killed or restarted.
    rt = runtime([sandbox()], [ctr(before, "app", CS.RUNNING), ctr(before, "side", CS.RUNNING)])
    a = compute_pod_actions(after, rt, Backoff(), now=1000)
    assert not a.to_kill and not a.to_start and not a.init_to_start and not a.kill_pod
    assert [s.name for s in a.ephemeral_to_start] == ["debugger", "debugger2"]


def test_ephemeral_containers_start_while_initialization_runs() -> None:
    p = with_debugger(pod("app", inits=("setup",)), "debugger")
    rt = runtime([sandbox()], [ctr(p, "setup", CS.RUNNING)])
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert [s.name for s in a.ephemeral_to_start] == ["debugger"] and not a.to_start


def test_no_ephemeral_container_starts_in_a_new_sandbox() -> None:
    p = with_debugger(pod("app"), "debugger")
    rt = runtime([sandbox(SandboxState.NOTREADY)], [ctr(p, "app", CS.EXITED, exit_code=1)])
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert a.create_sandbox and not a.ephemeral_to_start


def test_a_running_ephemeral_container_does_not_keep_a_finished_pod_alive() -> None:
    p = with_debugger(pod("app", policy="Never"), "debugger")
    rt = runtime(
        [sandbox()], [ctr(p, "app", CS.EXITED, exit_code=0), ctr(p, "debugger", CS.RUNNING)]
    )
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert a.kill_pod and not a.ephemeral_to_start


def test_a_finished_pod_starts_no_ephemeral_container() -> None:
    p = with_debugger(pod("app", policy="Never"), "debugger")
    rt = runtime([sandbox()], [ctr(p, "app", CS.EXITED, exit_code=0)])
    a = compute_pod_actions(p, rt, Backoff(), now=1000)
    assert a.kill_pod and not a.ephemeral_to_start


def test_status_lists_ephemeral_containers_apart_and_never_ready() -> None:
    p = with_debugger(pod("app"), "debugger", "later")
    rt = runtime([sandbox()], [ctr(p, "app", CS.RUNNING), ctr(p, "debugger", CS.RUNNING)])
    status = compute_pod_status(p, rt, waiting={}, previous=None, now=1000)
    assert [s["name"] for s in status["containerStatuses"]] == ["app"]
    running, later = status["ephemeralContainerStatuses"]
    assert running["name"] == "debugger" and "running" in running["state"]
    assert running["containerID"] == "containerd://debugger-0"
    assert running["imageID"] == "sha256:abc" and running["image"] == IMAGE
    assert running["ready"] is False and "started" not in running
    assert later["state"] == {"waiting": {"reason": "ContainerCreating"}}
    # The pod's phase and readiness are its regular containers'.
    assert status["phase"] == "Running"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


def test_status_of_an_exited_ephemeral_container_is_terminated() -> None:
    p = with_debugger(pod("app"), "debugger")
    rt = runtime(
        [sandbox()],
        [ctr(p, "app", CS.RUNNING), ctr(p, "debugger", CS.EXITED, exit_code=3, finished_s=200)],
    )
    status = compute_pod_status(p, rt, waiting={}, previous=None, now=1000)
    [debugger] = status["ephemeralContainerStatuses"]
    assert debugger["state"]["terminated"]["exitCode"] == 3


def test_status_without_ephemeral_containers_has_no_such_list() -> None:
    p = pod("app")
    rt = runtime([sandbox()], [ctr(p, "app", CS.RUNNING)])
    assert "ephemeralContainerStatuses" not in compute_pod_status(
        p, rt, waiting={}, previous=None, now=1000
    )


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_syncing_starts_the_debugger_in_the_pods_sandbox_once(w: World) -> None:
    p = pod("app")
    await w.sync(p)
    app = w.latest("app")
    debugged = with_debugger(p, "debugger")
    result = await w.sync(debugged)
    assert result.acted and result.waiting == {}
    debugger = w.latest("debugger")
    assert debugger.sandbox_id == app.sandbox_id and debugger.state == CS.RUNNING
    assert debugger.config.labels[L.CONTAINER_NAME] == "debugger"
    assert debugger.config.tty and debugger.config.stdin
    assert w.latest("app").id == app.id and app.state == CS.RUNNING  # untouched
    started = [e for e in w.events.records if e.reason == "Started"]
    assert started[-1].field_path == "spec.ephemeralContainers{debugger}"
    assert debugger.config.security.namespaces.pid == NamespaceMode.CONTAINER
    # It exits: it is not started again, and the pod goes on.
    w.cri.exit_container(debugger.id, 0)
    assert not (await w.sync(debugged)).acted
    assert len(w.cri.containers) == 2 and w.live() == ["app"]


async def test_a_targeted_debugger_joins_the_target_containers_pid_namespace(w: World) -> None:
    p = pod("app")
    await w.sync(p)
    await w.sync(with_debugger(p, "debugger", targetContainerName="app"))
    debugger = w.latest("debugger").config
    ns = debugger.security.namespaces
    assert ns.pid == NamespaceMode.TARGET and ns.target_id == w.latest("app").id
    # ... and so does the CRI request.
    sent = _container_pb(debugger).linux.security_context.namespace_options
    assert sent.pid == pb.NamespaceMode.TARGET and sent.target_id == w.latest("app").id


async def test_a_targeted_debugger_follows_a_shared_process_namespace(w: World) -> None:
    p = pod("app", shareProcessNamespace=True)
    await w.sync(p)
    await w.sync(with_debugger(p, "debugger", targetContainerName="app"))
    ns = w.latest("debugger").config.security.namespaces
    assert ns.pid == NamespaceMode.POD and ns.target_id == ""


async def test_a_debugger_whose_target_is_missing_waits(w: World) -> None:
    p = pod("app")
    await w.sync(p)
    result = await w.sync(with_debugger(p, "debugger", targetContainerName="nope"))
    reason, message = result.waiting["debugger"]
    assert reason == "CreateContainerConfigError" and "'nope'" in message
    assert result.failed  # retried after the pod worker's back-off
    assert w.live() == ["app"]

"""PodSyncer with init containers and sidecars against FakeRuntimeService: init
containers started one per sync in order and the main containers only after the last
one succeeded; a new sandbox purges the old init containers and starts over; KillPod
stops the main containers before the sidecars, last sidecar first; a container that
sets fields klet ignores gets a FieldsIgnored Warning event when its sandbox is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import ContainerState

from .helpers import pod
from .test_syncpod import World


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


def started(w: World) -> list[str]:
    ids = [c[1] for c in w.cri.calls_of("StartContainer")]
    return [w.cri.containers[i].config.name for i in ids if i in w.cri.containers]


async def test_init_containers_run_one_per_sync_in_order(w: World) -> None:
    p = pod("main", inits=("first", "second"))
    await w.sync(p)
    assert w.live() == ["first"] and len(w.cri.sandboxes) == 1
    assert not (await w.sync(p)).acted  # still running: wait

    w.cri.exit_container(w.latest("first").id, 0)
    await w.sync(p)
    assert w.live() == ["second"]
    w.cri.exit_container(w.latest("second").id, 0)
    await w.sync(p)
    assert w.live() == ["main"]
    assert started(w) == ["first", "second", "main"]


async def test_failed_init_container_is_retried_before_anything_else(w: World) -> None:
    p = pod("main", inits=("first", "second"))
    await w.sync(p)
    w.cri.exit_container(w.latest("first").id, 1)
    w.clock.advance(1)
    result = await w.sync(p)
    assert result.waiting == {} and w.live() == ["first"]
    assert w.latest("first").config.attempt == 1
    assert started(w) == ["first", "first"]


async def test_new_sandbox_purges_init_containers_and_starts_over(w: World) -> None:
    p = pod("main", inits=("first",))
    await w.sync(p)
    w.cri.exit_container(w.latest("first").id, 0)
    await w.sync(p)
    assert w.live() == ["main"]
    [sandbox] = w.cri.sandboxes.values()
    w.cri.sandboxes[sandbox.id].state = sandbox.state.NOTREADY  # the sandbox died
    old_first = w.latest("first").id
    await w.sync(p)
    assert old_first not in w.cri.containers  # purged
    assert w.live() == ["first"] and len(w.cri.calls_of("RunPodSandbox")) == 2


async def test_kill_pod_stops_main_containers_then_sidecars_in_reverse(w: World) -> None:
    p = pod(
        "main",
        inits=(
            {"name": "proxy", "restartPolicy": "Always"},
            {"name": "metrics", "restartPolicy": "Always"},
        ),
    )
    await w.sync(p)
    await w.sync(p)
    await w.sync(p)
    assert sorted(w.live()) == ["main", "metrics", "proxy"]
    await w.syncer.kill_pod(p, await w.runtime.get("u1"), grace_override=None, remove=False)
    stopped = [w.cri.containers[c[1]].config.name for c in w.cri.calls_of("StopContainer")]
    assert stopped == ["main", "metrics", "proxy"]
    assert all(c.state == ContainerState.EXITED for c in w.cri.containers.values())


async def test_ignored_fields_get_a_warning_event(w: World) -> None:
    p: dict[str, Any] = pod("main")
    p["spec"]["containers"][0]["restartPolicyRules"] = [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
    ]
    await w.sync(p)
    warnings = [r for r in w.events.records if r[1] == "FieldsIgnored"]
    assert [(e.type, e.field_path) for e in warnings] == [("Warning", "spec.containers{main}")]
    await w.sync(p)  # once per sandbox, not per sync
    assert len([r for r in w.events.records if r[1] == "FieldsIgnored"]) == 1

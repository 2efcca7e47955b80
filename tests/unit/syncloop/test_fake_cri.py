"""FakeRuntimeService keeps CRI state the way containerd 1.6 does.

Covers the sandbox (READY → NOTREADY → removed) and container (CREATED → RUNNING →
EXITED) transitions, force-stop on removal, name reservation per attempt, label
filtering, IP allocation from 10.88.0.0/16, clock-driven timestamps, images present,
pulled and failing, NotFound for unknown IDs, the call log, hooks and error injection.
"""

from __future__ import annotations

import pytest
from klet.cri import CRIError, NotFound
from klet.cri.types import ContainerConfig, ContainerState, SandboxConfig, SandboxState
from klet.model.types import ContainerID, SandboxID
from klet.testbed.fakes.cri import KILLED_EXIT_CODE, FakeRuntimeService

IMAGE = "registry.klet.test/busybox:1.36"


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000

    def __call__(self) -> int:
        self.ns += 1_000
        return self.ns


def sandbox_config(uid: str = "u1", attempt: int = 0, **kw: object) -> SandboxConfig:
    return SandboxConfig(
        name="web",
        namespace="default",
        uid=uid,
        attempt=attempt,
        hostname="web",
        log_directory=f"/var/log/pods/default_web_{uid}",
        labels={"io.kubernetes.pod.uid": uid, "app": "web"},
        annotations={"a": "1"},
        **kw,  # type: ignore[arg-type]
    )


def container_config(name: str = "app", attempt: int = 0, image: str = IMAGE) -> ContainerConfig:
    return ContainerConfig(
        name=name,
        attempt=attempt,
        image=image,
        log_path=f"{name}/{attempt}.log",
        labels={"io.kubernetes.container.name": name},
        annotations={"n": str(attempt)},
    )


@pytest.fixture
def fake() -> FakeRuntimeService:
    f = FakeRuntimeService(clock=Clock())
    f.add_image(IMAGE, 1234)
    return f


async def running(fake: FakeRuntimeService, uid: str = "u1") -> tuple[SandboxID, ContainerID]:
    cfg = sandbox_config(uid)
    sid = await fake.run_pod_sandbox(cfg)
    cid = await fake.create_container(sid, container_config(), cfg)
    await fake.start_container(cid)
    return sid, cid


async def test_sandbox_ready_then_notready_then_removed(fake: FakeRuntimeService) -> None:
    cfg = sandbox_config()
    sid = await fake.run_pod_sandbox(cfg)
    st = await fake.pod_sandbox_status(sid)
    assert st.state == SandboxState.READY and st.ip == "10.88.0.2"
    assert st.labels == cfg.labels and st.annotations == {"a": "1"}
    await fake.stop_pod_sandbox(sid)
    st = await fake.pod_sandbox_status(sid)
    assert st.state == SandboxState.NOTREADY and st.ip == ""
    await fake.remove_pod_sandbox(sid)
    assert await fake.list_pod_sandboxes() == []
    with pytest.raises(NotFound):
        await fake.pod_sandbox_status(sid)


async def test_ips_come_from_the_pod_cidr_round_robin(fake: FakeRuntimeService) -> None:
    a = await fake.run_pod_sandbox(sandbox_config("a"))
    b = await fake.run_pod_sandbox(sandbox_config("b"))
    await fake.stop_pod_sandbox(a)
    c = await fake.run_pod_sandbox(sandbox_config("c"))
    host = await fake.run_pod_sandbox(sandbox_config("h", host_network=True))
    ips = [(await fake.pod_sandbox_status(s)).ip for s in (b, c, host)]
    assert ips == ["10.88.0.3", "10.88.0.4", ""]


async def test_container_lifecycle_with_clock_timestamps(fake: FakeRuntimeService) -> None:
    cfg = sandbox_config()
    sid = await fake.run_pod_sandbox(cfg)
    cid = await fake.create_container(sid, container_config(), cfg)
    st = await fake.container_status(cid)
    assert st.state == ContainerState.CREATED and st.started_at == 0
    assert st.log_path == "/var/log/pods/default_web_u1/app/0.log"
    assert st.image == IMAGE and st.image_ref.startswith("sha256:")
    await fake.start_container(cid)
    with pytest.raises(CRIError, match="CONTAINER_RUNNING"):
        await fake.start_container(cid)
    await fake.stop_container(cid, timeout_s=30)
    st = await fake.container_status(cid)
    assert st.state == ContainerState.EXITED
    assert (st.exit_code, st.reason) == (KILLED_EXIT_CODE, "Error")
    assert 0 < st.created_at < st.started_at < st.finished_at
    assert fake.calls_of("StopContainer") == [("StopContainer", cid, "30")]


async def test_exit_container_simulates_a_process_ending(fake: FakeRuntimeService) -> None:
    _, cid = await running(fake)
    fake.exit_container(cid, 0)
    st = await fake.container_status(cid)
    assert (st.state, st.exit_code, st.reason) == (ContainerState.EXITED, 0, "Completed")
    with pytest.raises(ValueError):
        fake.exit_container(cid, 1)
    _, other = await running(fake, "u2")
    fake.exit_container(other, 3, reason="OOMKilled")
    assert (await fake.container_status(other)).reason == "OOMKilled"


async def test_stop_sandbox_kills_its_containers(fake: FakeRuntimeService) -> None:
    sid, cid = await running(fake)
    await fake.stop_pod_sandbox(sid)
    assert (await fake.container_status(cid)).exit_code == KILLED_EXIT_CODE
    with pytest.raises(CRIError, match="not ready"):
        await fake.create_container(sid, container_config(attempt=1), sandbox_config())


async def test_remove_running_sandbox_force_stops_and_removes_containers(
    fake: FakeRuntimeService,
) -> None:
    sid, _ = await running(fake)
    other_sid, other = await running(fake, "u2")
    await fake.remove_pod_sandbox(sid)
    assert [s.id for s in await fake.list_pod_sandboxes()] == [other_sid]
    assert [c.id for c in await fake.list_containers()] == [other]


async def test_remove_running_container_force_stops_it(fake: FakeRuntimeService) -> None:
    _, cid = await running(fake)
    await fake.remove_container(cid)
    assert cid not in fake.containers
    with pytest.raises(NotFound):
        await fake.container_status(cid)


async def test_unknown_ids(fake: FakeRuntimeService) -> None:
    ghost = ContainerID("nope")
    for read in (fake.container_status(ghost), fake.start_container(ghost)):
        with pytest.raises(NotFound):
            await read
    with pytest.raises(NotFound):
        await fake.create_container(SandboxID("nope"), container_config(), sandbox_config())
    # Like RuntimeClient, which swallows NotFound: stopping or removing is idempotent.
    await fake.stop_container(ghost, timeout_s=2)
    await fake.remove_container(ghost)
    await fake.stop_pod_sandbox(SandboxID("nope"))
    await fake.remove_pod_sandbox(SandboxID("nope"))


async def test_names_are_reserved_per_attempt(fake: FakeRuntimeService) -> None:
    cfg = sandbox_config()
    sid = await fake.run_pod_sandbox(cfg)
    with pytest.raises(CRIError, match="reserve sandbox name"):
        await fake.run_pod_sandbox(cfg)
    await fake.run_pod_sandbox(sandbox_config(attempt=1))
    await fake.create_container(sid, container_config(), cfg)
    with pytest.raises(CRIError, match="reserve container name"):
        await fake.create_container(sid, container_config(), cfg)
    await fake.create_container(sid, container_config(attempt=1), cfg)


async def test_label_selector_and_sandbox_filters(fake: FakeRuntimeService) -> None:
    sid, cid = await running(fake, "u1")
    await running(fake, "u2")
    mine = await fake.list_pod_sandboxes(label_selector={"io.kubernetes.pod.uid": "u1"})
    assert [s.id for s in mine] == [sid]
    assert len(await fake.list_pod_sandboxes(label_selector={"app": "web"})) == 2
    assert await fake.list_pod_sandboxes(label_selector={"app": "db"}) == []
    assert [c.id for c in await fake.list_containers(sandbox_id=sid)] == [cid]
    listed = await fake.list_containers(label_selector={"io.kubernetes.container.name": "app"})
    assert len(listed) == 2 and listed[0].annotations == {"n": "0"}


async def test_images_present_pulled_and_failing(fake: FakeRuntimeService) -> None:
    present = await fake.image_status(IMAGE)
    assert present is not None and present.size == 1234
    assert await fake.image_status("registry.klet.test/nginx:1.25") is None
    ref = await fake.pull_image("registry.klet.test/nginx:1.25")
    info = await fake.image_status("registry.klet.test/nginx:1.25")
    assert info is not None and info.id == ref
    assert await fake.image_status(ref) == info  # resolvable by ID, as CreateContainer needs
    fake.fail_pull("registry.klet.test/gone:1", NotFound("not found", code="NOT_FOUND"))
    with pytest.raises(NotFound):
        await fake.pull_image("registry.klet.test/gone:1")
    assert await fake.image_status("registry.klet.test/gone:1") is None
    fake.fail_pull("registry.klet.test/gone:1", None)
    await fake.pull_image("registry.klet.test/gone:1")
    await fake.remove_image(IMAGE)
    assert len(await fake.list_images()) == 2


async def test_create_needs_the_image(fake: FakeRuntimeService) -> None:
    cfg = sandbox_config()
    sid = await fake.run_pod_sandbox(cfg)
    with pytest.raises(NotFound, match="resolve image"):
        await fake.create_container(sid, container_config(image="registry.klet.test/x:1"), cfg)


async def test_fail_next_and_fail_always(fake: FakeRuntimeService) -> None:
    cfg = sandbox_config()
    sid = await fake.run_pod_sandbox(cfg)
    cid = await fake.create_container(sid, container_config(), cfg)
    fake.fail_next("StartContainer", CRIError("boom"))
    with pytest.raises(CRIError, match="boom"):
        await fake.start_container(cid)
    assert fake.containers[cid].state == ContainerState.CREATED  # nothing changed
    await fake.start_container(cid)
    fake.fail_always("ListPodSandbox", CRIError("down"))
    for _ in range(2):
        with pytest.raises(CRIError, match="down"):
            await fake.list_pod_sandboxes()
    fake.fail_always("ListPodSandbox", None)
    assert len(await fake.list_pod_sandboxes()) == 1
    with pytest.raises(ValueError):
        fake.fail_next("StartPod", CRIError("typo"))
    assert [c[0] for c in fake.calls] == [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StartContainer",
        "ListPodSandbox",
        "ListPodSandbox",
        "ListPodSandbox",
    ]


async def test_hook_runs_inside_the_call(fake: FakeRuntimeService) -> None:
    seen: list[int] = []

    async def hook() -> None:
        seen.append(len(fake.sandboxes))
        await fake.run_pod_sandbox(sandbox_config("late"))

    fake.hooks["ListPodSandbox"] = hook
    listed = await fake.list_pod_sandboxes()
    assert seen == [0] and [s.uid for s in listed] == ["late"]

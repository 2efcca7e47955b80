"""execwait: a graceful stop waits, boundedly, until the container's process is no
longer the runtime's init (`runc:[2:INIT]`), so its SIGTERM reaches the command and not
runc init's Go runtime (which, as PID 1 of the container, exits 2 instead of dying of
it). Containers started long ago, containers whose PID the runtime does not give and
processes that are gone are not waited for; a PID lookup error stops nothing; the wait
gives up after its limit. LifecycleHooks.stop waits only for graceful stops."""

from __future__ import annotations

from pathlib import Path

from klet.cri import CRIError
from klet.cri.types import ContainerConfig, SandboxConfig
from klet.model.types import ContainerID
from klet.syncloop.containers import execwait
from klet.syncloop.containers.hooks import LifecycleHooks
from klet.testbed.fakes.cri import FakeRuntimeService

from .helpers import RecordedEvents

NOW = 1_000.0


class Comms:
    """A process whose command name changes after `init_polls` reads."""

    def __init__(self, init_polls: int, after: str | None = "sleep") -> None:
        self.init_polls = init_polls
        self.after = after
        self.reads = 0

    def __call__(self, pid: int) -> str | None:
        self.reads += 1
        return "runc:[2:INIT]" if self.reads <= self.init_polls else self.after


class Pids:
    def __init__(self, pid: int = 4242, error: CRIError | None = None) -> None:
        self.pid, self.error, self.asked = pid, error, 0

    async def container_pid(self, container_id: ContainerID) -> int:
        self.asked += 1
        if self.error is not None:
            raise self.error
        return self.pid


async def no_sleep(_: float) -> None:
    return None


async def wait(pids: Pids, comms: Comms, **kw: object) -> bool:
    return await execwait.wait_for_exec(
        pids,
        ContainerID("c1"),
        comm_of=comms,
        sleep=no_sleep,
        clock=lambda: NOW,
        **kw,  # type: ignore[arg-type]
    )


async def test_waits_until_the_init_has_execd() -> None:
    comms = Comms(init_polls=3)
    assert await wait(Pids(), comms, started_at_ns=int((NOW - 0.01) * 1e9)) is True
    assert comms.reads == 4


async def test_gives_up_after_the_limit() -> None:
    comms = Comms(init_polls=10_000)
    assert await wait(Pids(), comms, limit_s=0.05) is False
    assert comms.reads == round(0.05 / execwait.POLL_S) + 1


async def test_old_containers_unknown_pids_and_gone_processes_are_not_waited_for() -> None:
    pids = Pids()
    old = int((NOW - execwait.RECENT_S - 1) * 1e9)
    assert await wait(pids, Comms(init_polls=10_000), started_at_ns=old) is True
    assert pids.asked == 0
    comms = Comms(init_polls=10_000)
    assert await wait(Pids(pid=0), comms) is True and comms.reads == 0
    assert await wait(Pids(), Comms(init_polls=0, after=None)) is True
    error = CRIError("ContainerStatus: NOT_FOUND")
    assert await wait(Pids(error=error), Comms(init_polls=10_000)) is True


def test_in_runtime_init_and_read_comm(tmp_path: Path) -> None:
    assert execwait.in_runtime_init("runc:[2:INIT]")
    assert execwait.in_runtime_init("runc:[1:CHILD]")
    assert not execwait.in_runtime_init("sleep")
    assert not execwait.in_runtime_init(None)
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "comm").write_text("runc:[2:INIT]\n")
    assert execwait.read_comm(77, proc=tmp_path) == "runc:[2:INIT]"
    assert execwait.read_comm(78, proc=tmp_path) is None


async def test_hooks_stop_looks_up_the_pid_only_for_graceful_stops() -> None:
    cri = FakeRuntimeService()
    cri.add_image("busybox")
    cfg = SandboxConfig("p", "default", "u1", 0, "p", "/tmp/klet-test-logs")
    sandbox = await cri.run_pod_sandbox(cfg)
    ids = []
    for attempt in range(2):
        cid = await cri.create_container(sandbox, ContainerConfig("c", attempt, "busybox"), cfg)
        await cri.start_container(cid)
        ids.append(cid)
    hooks = LifecycleHooks(cri=cri, events=RecordedEvents(), sleep=no_sleep)
    await hooks.stop(ids[0], timeout_s=0)
    assert [c[0] for c in cri.calls[-1:]] == ["StopContainer"]
    assert ("ContainerStatus", ids[0]) not in cri.calls
    await hooks.stop(ids[1], timeout_s=30)
    assert ("ContainerStatus", ids[1]) in cri.calls
    assert cri.calls[-1][0] == "StopContainer"

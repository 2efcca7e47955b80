"""The pure half of the stats provider: /proc parsers (the default route's interface from
fixture files of /proc/net/route and ipv6_route among them), statfs arithmetic, and how ready
sandboxes, running containers and container stats are joined into pods and picked
from (running containers for the Summary, latest attempts for eviction)."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.cri import labels as L
from klet.cri.types import (
    Container,
    ContainerState,
    ContainerStatsInfo,
    Sandbox,
    SandboxState,
)
from klet.model.types import ContainerID, SandboxID
from klet.stats.model import (
    FsUsage,
    PodStats,
    latest_attempts,
    parse_btime,
    parse_default_route,
    parse_loadavg_tasks,
    parse_swap_space,
    plan_pods,
    running_containers,
)


@pytest.mark.parametrize(
    ("text", "tasks"),
    [
        ("0.22 0.54 0.75 1/164 20474\n", 164),
        ("1.00 2.00 3.00 12/70000 1\n", 70000),  # above sysinfo's 16-bit truncation
        ("0.1 0.2 0.3\n", None),
        ("0.1 0.2 0.3 x/y 1\n", None),
        ("", None),
    ],
)
def test_loadavg_tasks(text: str, tasks: int | None) -> None:
    assert parse_loadavg_tasks(text) == tasks


def test_btime() -> None:
    assert parse_btime("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n") == 1_700_000_000 * 10**9
    assert parse_btime("cpu  1 2 3\n") is None
    assert parse_btime("btime soon\n") is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("SwapTotal:  2048 kB\nSwapFree:  512 kB\n", (2048 * 1024, 512 * 1024)),
        ("SwapTotal:        0 kB\nSwapFree:         0 kB\n", (0, 0)),
        ("SwapTotal:  2048 kB\n", None),  # no SwapFree: nothing to say
        ("MemTotal: 1 kB\n", None),
    ],
)
def test_swap_space(text: str, want: tuple[int, int] | None) -> None:
    assert parse_swap_space(text) == want


def test_fs_usage_arithmetic() -> None:
    fs = FsUsage(blocks=1000, bfree=300, bavail=250, frsize=4096, files=64, ffree=60, device=7)
    assert fs.capacity_bytes == 1000 * 4096
    assert fs.available_bytes == 250 * 4096  # free to unprivileged users, not bfree
    assert fs.used_bytes == 700 * 4096
    assert fs.inodes_used == 4


def sandbox(uid: str, state: SandboxState = SandboxState.READY) -> Sandbox:
    return Sandbox(SandboxID(f"sb-{uid}"), f"pod-{uid}", "ns", uid, 0, state, 5)


def container(cid: str, uid: str, name: str, attempt: int, state: ContainerState) -> Container:
    return Container(
        ContainerID(cid),
        SandboxID(f"sb-{uid}"),
        f"k8s_{name}",
        attempt,
        "busybox",
        "sha",
        state,
        100 + attempt,
        labels={L.POD_UID: uid, L.CONTAINER_NAME: name},
    )


def stats(cid: str, uid: str | None, name: str, attempt: int, ws: int) -> ContainerStatsInfo:
    labels = {L.POD_UID: uid, L.CONTAINER_NAME: name} if uid is not None else {}
    return ContainerStatsInfo(
        ContainerID(cid), name, attempt, labels, {}, 0, None, None, 0, ws, ws, None, None, None
    )


def test_plan_joins_running_containers_and_stats_per_ready_sandbox() -> None:
    plans = plan_pods(
        [sandbox("u1"), sandbox("u2", SandboxState.NOTREADY), sandbox("u3")],
        [
            container("c1", "u1", "app", 1, ContainerState.RUNNING),
            container("c0", "u1", "app", 0, ContainerState.EXITED),
            container("c9", "u2", "app", 0, ContainerState.RUNNING),
        ],
        [
            stats("c1", None, "app", 1, 70),  # no labels: joined by container ID
            stats("c0", "u1", "app", 0, 10),  # an exited attempt: known from stats only
            stats("c5", "u3", "init", 0, 5),
        ],
    )
    assert [s.uid for s, _ in plans] == ["u1", "u3"]  # ready sandboxes only
    [(_, u1), (_, u3)] = plans
    assert [(c.id, c.name, c.running, c.start_ns) for c in u1] == [
        ("c0", "app", False, None),
        ("c1", "app", True, 101),
    ]
    assert u1[1].usage is not None and u1[1].usage.memory_working_set_bytes == 70
    assert [(c.id, c.running) for c in u3] == [("c5", False)]


def test_plan_of_nothing_is_empty() -> None:
    assert plan_pods([], [], []) == []
    assert plan_pods([sandbox("u1")], [], []) == [(sandbox("u1"), [])]


def pod_of(
    uid: str, sb: Sandbox, containers: list[Container], st: list[ContainerStatsInfo]
) -> PodStats:
    [(_, planned)] = plan_pods([sb], containers, st)
    return PodStats(uid=uid, namespace="ns", name="p", start_ns=0, cgroup=None, processes=None,
                    containers=planned)  # fmt: skip


def test_summary_takes_running_and_eviction_takes_latest_attempts() -> None:
    pod = pod_of(
        "u1",
        sandbox("u1"),
        [
            container("c2", "u1", "app", 2, ContainerState.RUNNING),
            container("s0", "u1", "side", 0, ContainerState.RUNNING),  # no stats yet
        ],
        [
            stats("c0", "u1", "app", 0, 10),
            stats("c1", "u1", "app", 1, 20),
            stats("c2", "u1", "app", 2, 30),
            stats("d0", "u1", "done", 0, 40),  # exited and not restarted
        ],
    )
    assert [c.id for c in running_containers(pod)] == ["c2", "s0"]
    latest = latest_attempts(pod)
    assert {n: c.id for n, c in latest.items()} == {"app": "c2", "done": "d0"}


@pytest.mark.parametrize("attempts", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_latest_attempt_does_not_depend_on_runtime_order(attempts: list[int]) -> None:
    pod = pod_of("u1", sandbox("u1"), [], [stats(f"c{a}", "u1", "app", a, a) for a in attempts])
    assert latest_attempts(pod)["app"].id == "c2"


NET = Path(__file__).parent / "fixtures" / "net"


@pytest.mark.parametrize(
    ("ipv4", "ipv6", "interface"),
    [
        ("route-host", None, "eth0"),  # this test machine's own table
        ("route-two-defaults", None, "ens3"),  # lowest metric; a reject route never
        ("route-no-default", None, None),
        ("route-no-default", "ipv6_route-v6-only", "ens5"),  # not lo's unreachable one
        ("route-host", "ipv6_route-v6-only", "eth0"),  # IPv4's first
    ],
)
def test_parse_default_route(ipv4: str, ipv6: str | None, interface: str | None) -> None:
    v6 = (NET / ipv6).read_text() if ipv6 else ""
    assert parse_default_route((NET / ipv4).read_text(), v6) == interface
    assert parse_default_route("", "") is None

"""`/stats/summary`'s network figures (kubeletapi/stats.py): NetworkStats as upstream's
stats/v1alpha1 shapes it (the default interface's counters inline, every interface in
`interfaces` with the default first), the node's default from its default route and a
pod's `eth0`, from fixture files of /proc; no `network` with only_cpu_and_memory, nor for
a pod without a network namespace of its own. Swap: the node's from /proc/meminfo, a
pod's and a container's from their cgroups (available = limit - usage, none without a
limit), with only_cpu_and_memory too."""

from __future__ import annotations

from pathlib import Path

from klet.cgroups import CgroupStats
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.model.types import ContainerID, SandboxID
from klet.stats import HostReader, StatsProvider
from klet.stats.cadvisor import NetDev
from klet.status_reporter.kubeletapi.stats import SummaryProvider, network_stats, rfc3339
from klet.testbed.fakes.stats import FakeCgroups, FakeStatsRuntime

NET = Path(__file__).parents[2] / "stats" / "fixtures" / "net"
UID = "1111-2222"
NOW = 1_700_000_000 * 10**9


def test_network_stats_puts_the_default_first_and_inline() -> None:
    devs = {
        "net1": NetDev(5, 1, 0, 0, 7, 1, 0, 0),
        "eth0": NetDev(9048, 64, 1, 0, 3186, 33, 2, 0),
        "a0": NetDev(1, 1, 0, 0, 2, 1, 0, 0),
    }
    eth0 = {"name": "eth0", "rxBytes": 9048, "rxErrors": 1, "txBytes": 3186, "txErrors": 2}
    assert network_stats(devs, "eth0", NOW) == {
        "time": rfc3339(NOW),
        **eth0,
        "interfaces": [
            eth0,
            {"name": "a0", "rxBytes": 1, "rxErrors": 0, "txBytes": 2, "txErrors": 0},
            {"name": "net1", "rxBytes": 5, "rxErrors": 0, "txBytes": 7, "txErrors": 0},
        ],
    }


def test_network_stats_without_the_default_interface() -> None:
    # upstream's zero InterfaceStats: only an empty name inline
    devs = {"ens3": NetDev(1, 1, 0, 0, 2, 1, 0, 0)}
    stats = network_stats(devs, "eth0", NOW)
    assert (stats["name"], "rxBytes" in stats) == ("", False)
    assert [i["name"] for i in stats["interfaces"]] == ["ens3"]
    assert network_stats({}, None, NOW) == {"time": rfc3339(NOW), "name": ""}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def provider(
    tmp: Path,
    *,
    pod_netns: str = "net:[4026532211]",
    cgroups: FakeCgroups | None = None,
    runtime: FakeStatsRuntime | None = None,
) -> SummaryProvider:
    proc = tmp / "proc"
    write(proc / "net/dev", (NET / "dev-host").read_text())
    write(proc / "net/route", (NET / "route-host").read_text())
    write(proc / "42/net/dev", (NET / "dev-pod").read_text())
    for pid, ns in (("self", "net:[4026531840]"), ("42", pod_netns)):
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "ns/net").symlink_to(ns)
    cgroups = cgroups or FakeCgroups()
    cgroups.groups["/"] = CgroupStats(4000, 3000, 10**9, None)
    cgroups.groups[f"/kubepods/besteffort/pod{UID}"] = CgroupStats(10, 8, 10**6, None)
    cgroups.pids[f"/kubepods/besteffort/pod{UID}"] = [42]
    runtime = runtime or FakeStatsRuntime()
    runtime.sandboxes = [Sandbox(SandboxID("sb1"), "web", "ns", UID, 0, SandboxState.READY, 77)]
    host = HostReader(
        cgroups=cgroups, root_dir=tmp, cgroup_root="/", pod_logs_dir=tmp / "logs", proc=proc
    )
    return SummaryProvider(node_name="n1", stats=StatsProvider(runtime, host, clock=lambda: NOW))


async def test_summary_network_of_the_node_and_a_pod(tmp_path: Path) -> None:
    summary = await provider(tmp_path).summary()
    node = summary["node"]["network"]
    # the default route leaves by eth0 on this fixture (this test machine's own table)
    assert (node["name"], node["rxBytes"], node["txBytes"]) == ("eth0", 1383529459, 5540222)
    names = [i["name"] for i in node["interfaces"]]
    assert names == ["eth0", "ifb0", "ifb1", "kl0a977962", "kl25ffd664", "kl95b944e2"]
    [pod] = summary["pods"]
    assert pod["network"] == {
        "time": rfc3339(NOW),
        "name": "eth0",
        "rxBytes": 9048,
        "rxErrors": 1,
        "txBytes": 3186,
        "txErrors": 2,
        "interfaces": [
            {"name": "eth0", "rxBytes": 9048, "rxErrors": 1, "txBytes": 3186, "txErrors": 2},
            {"name": "net1", "rxBytes": 500, "rxErrors": 0, "txBytes": 700, "txErrors": 0},
        ],
    }
    lean = await provider(tmp_path / "again").summary(only_cpu_and_memory=True)
    assert "network" not in lean["node"] and "network" not in lean["pods"][0]


async def test_a_host_network_pod_has_no_network(tmp_path: Path) -> None:
    summary = await provider(tmp_path, pod_netns="net:[4026531840]").summary()
    assert "network" in summary["node"]
    assert "network" not in summary["pods"][0]


async def test_swap_of_the_node_a_pod_and_a_container(tmp_path: Path) -> None:
    cgroups, runtime = FakeCgroups(), FakeStatsRuntime()
    summaries = provider(tmp_path, cgroups=cgroups, runtime=runtime)
    meminfo = tmp_path / "proc" / "meminfo"
    write(meminfo, "MemTotal: 8 kB\nSwapTotal:  2048 kB\nSwapFree:  512 kB\n")
    pod = f"/kubepods/besteffort/pod{UID}"
    cgroups.groups[pod] = CgroupStats(10, 8, 10**6, None, swap_usage_bytes=100)
    cgroups.groups[f"{pod}/c1"] = CgroupStats(
        5, 4, 10**5, None, swap_usage_bytes=40, swap_limit_bytes=1000
    )
    runtime.containers = [
        Container(
            ContainerID("c1"), SandboxID("sb1"), "app", 0, "busybox", "sha256:1",
            ContainerState.RUNNING, 88, labels={L.POD_UID: UID, L.CONTAINER_NAME: "app"},
        )
    ]  # fmt: skip
    for lean in (False, True):
        summary = await summaries.summary(only_cpu_and_memory=lean)
        assert summary["node"]["swap"] == {
            "time": rfc3339(NOW),
            "swapAvailableBytes": 512 * 1024,
            "swapUsageBytes": 1536 * 1024,
        }
        [p] = summary["pods"]
        assert p["swap"] == {"time": rfc3339(NOW), "swapUsageBytes": 100}  # no limit
        [c] = p["containers"]
        assert c["swap"] == {
            "time": rfc3339(NOW),
            "swapAvailableBytes": 960,
            "swapUsageBytes": 40,
        }
    # a cgroup that gives no swap usage (v1 without swap accounting): no swap, not 0
    cgroups.groups[pod] = CgroupStats(10, 8, 10**6, None)
    write(meminfo, "MemTotal: 8 kB\n")
    summary = await summaries.summary()
    assert "swap" not in summary["pods"][0] and "swap" not in summary["node"]

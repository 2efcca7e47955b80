"""Pressure stall information (KubeletPSI), from the kernel's files to what is served.

The parser over fixture files (tests/unit/stats/fixtures/psi: this test machine's own
/proc/pressure files, a cgroup's memory.pressure, a kernel before 5.13 without cpu's
`full` line, and malformed ones); HostReader's node PSI from <proc>/pressure and a
cgroup's from its cgroup v2 `*.pressure` files, none on a cgroup v1 host or with the
gate off; the provider putting them on the node, pods and containers; /stats/summary's
`psi` under cpu, memory and io (absent where there is none, and io left out with
only_cpu_and_memory); cAdvisor's `container_pressure_*_seconds_total` (the totals in
seconds, only on the series that have PSI).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from klet.cgroups import CgroupStats
from klet.cri import labels as L
from klet.cri.types import Container, ContainerState, Sandbox, SandboxState
from klet.model.types import ContainerID, SandboxID
from klet.stats import HostReader, StatsProvider
from klet.stats.cadvisor import cadvisor_families
from klet.stats.psi import Pressure, PSIData, PSIStats, parse_psi
from klet.status_reporter.kubeletapi.stats import SummaryProvider
from klet.testbed.fakes.stats import FakeCgroups, FakeStatsRuntime

FIXTURES = Path(__file__).parent / "fixtures" / "psi"
UID = "5a5a-psi"
POD = f"/kubepods/besteffort/pod{UID}"
CGROUP = FIXTURES / "cgroup-memory.pressure"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_parse_the_kernels_files() -> None:
    memory = parse_psi(fixture("cgroup-memory.pressure"))
    assert memory == PSIStats(
        some=PSIData(avg10=2.04, avg60=1.12, avg300=0.31, total_us=987654321),
        full=PSIData(avg10=1.01, avg60=0.50, avg300=0.10, total_us=123456789),
    )
    # this machine's own files parse, whatever their numbers
    for resource in ("cpu", "memory", "io"):
        assert parse_psi(fixture(f"node-{resource}.pressure")) is not None
    # cpu had no `full` line before Linux 5.13: zeros, as runc leaves it
    old = parse_psi(fixture("cpu-before-5.13.pressure"))
    assert old == PSIStats(some=PSIData(1.5, 0.75, 0.2, 4321), full=PSIData())


@pytest.mark.parametrize(
    "text",
    [
        fixture("no-some.pressure"),
        fixture("malformed-full.pressure"),
        "",
        "some avg10=1 avg60=1 total=5\n",  # avg300 missing
        "some avg10=1 avg60=1 avg300=1 total=-5\n",
        "some avg10=1 avg60=1 avg300=1 total\n",
    ],
)
def test_what_does_not_parse_is_no_reading(text: str) -> None:
    assert parse_psi(text) is None


def host_tree(tmp: Path, *, v2: bool) -> tuple[Path, Path | None]:
    """A /proc with pressure files and, for v2, a unified tree with the pod's and its
    container's memory.pressure (cpu and io too for the container)."""
    proc = tmp / "proc"
    (proc / "pressure").mkdir(parents=True)
    for resource in ("cpu", "memory", "io"):
        shutil.copy(FIXTURES / f"node-{resource}.pressure", proc / "pressure" / resource)
    (proc / "meminfo").write_text("MemTotal: 1024 kB\n")
    if not v2:
        return proc, None
    unified = tmp / "cgroup"
    pod = unified / POD.strip("/")
    (pod / "c1").mkdir(parents=True)
    shutil.copy(CGROUP, pod / "memory.pressure")
    for resource in ("cpu", "memory", "io"):
        shutil.copy(CGROUP, pod / "c1" / f"{resource}.pressure")
    return proc, unified


def reader(tmp: Path, cg: FakeCgroups, *, v2: bool = True, psi: bool = True) -> HostReader:
    proc, unified = host_tree(tmp, v2=v2)
    return HostReader(
        cgroups=cg,
        root_dir=tmp / "root",
        pod_logs_dir=tmp / "logs",
        cgroup_root="/",
        proc=proc,
        sys=tmp / "sys",
        psi=psi,
        unified=unified,
    )


def test_host_reader(tmp_path: Path) -> None:
    host = reader(tmp_path / "a", FakeCgroups())
    node = host.node_pressure()
    assert node is not None
    assert node.cpu == parse_psi(fixture("node-cpu.pressure"))
    assert node.io == parse_psi(fixture("node-io.pressure"))
    pod = host.cgroup_pressure(POD)
    assert pod == Pressure(memory=parse_psi(CGROUP.read_text()))
    assert host.cgroup_pressure("/kubepods/none") is None  # no such files
    v1 = reader(tmp_path / "b", FakeCgroups(), v2=False)
    assert v1.node_pressure() is not None and v1.cgroup_pressure(POD) is None
    off = reader(tmp_path / "c", FakeCgroups(), psi=False)
    assert off.node_pressure() is None and off.cgroup_pressure(POD) is None


def provider(tmp: Path, *, v2: bool = True) -> StatsProvider:
    cg = FakeCgroups()
    cg.groups["/"] = CgroupStats(100, 50, 10**9, None)
    cg.groups[POD] = CgroupStats(30, 20, 5 * 10**8, 2)
    cg.groups[f"{POD}/c1"] = CgroupStats(10, 5, 10**8, 1)
    rt = FakeStatsRuntime()
    rt.sandboxes = [Sandbox(SandboxID("sb1"), "web", "ns", UID, 0, SandboxState.READY, 10**9)]
    rt.containers = [
        Container(
            ContainerID("c1"), SandboxID("sb1"), "app", 0, "busybox", "sha256:1",
            ContainerState.RUNNING, 2 * 10**9, labels={L.POD_UID: UID, L.CONTAINER_NAME: "app"},
        )
    ]  # fmt: skip
    return StatsProvider(rt, reader(tmp, cg, v2=v2), clock=lambda: 10 * 10**9)


def psi_json(name: str) -> dict[str, object]:
    stats = parse_psi(fixture(name))
    assert stats is not None
    return {
        line: {
            "total": d.total_us,
            "avg10": d.avg10,
            "avg60": d.avg60,
            "avg300": d.avg300,
        }
        for line, d in (("full", stats.full), ("some", stats.some))
    }


async def test_summary_on_cgroup_v2(tmp_path: Path) -> None:
    summary = await SummaryProvider(node_name="n1", stats=provider(tmp_path)).summary()
    node = summary["node"]
    assert node["cpu"]["psi"] == psi_json("node-cpu.pressure")
    assert node["memory"]["psi"] == psi_json("node-memory.pressure")
    assert node["io"]["psi"] == psi_json("node-io.pressure") and "time" in node["io"]
    [pod] = summary["pods"]
    cgroup = psi_json("cgroup-memory.pressure")
    # the pod cgroup has memory.pressure only: cpu and io have no psi, so no `io`
    assert pod["memory"]["psi"] == cgroup
    assert "psi" not in pod["cpu"] and "io" not in pod
    [app] = pod["containers"]
    assert app["cpu"]["psi"] == app["memory"]["psi"] == app["io"]["psi"] == cgroup
    # the CPU-and-memory form keeps cpu's and memory's psi, leaves io out (as upstream)
    small = await SummaryProvider(node_name="n1", stats=provider(tmp_path / "s")).summary(
        only_cpu_and_memory=True
    )
    assert "io" not in small["node"] and "psi" in small["node"]["cpu"]
    assert "io" not in small["pods"][0]["containers"][0]


async def test_summary_on_cgroup_v1_has_node_psi_only(tmp_path: Path) -> None:
    summary = await SummaryProvider(node_name="n1", stats=provider(tmp_path, v2=False)).summary()
    assert summary["node"]["cpu"]["psi"] == psi_json("node-cpu.pressure")
    [pod] = summary["pods"]
    assert "io" not in pod and "psi" not in pod["memory"] and "psi" not in pod["cpu"]
    [app] = pod["containers"]
    assert "io" not in app and "psi" not in app["cpu"] and "psi" not in app["memory"]


def samples(families: list[object], name: str) -> dict[str, float]:
    [family] = [f for f in families if getattr(f, "name", "") == name.removesuffix("_total")]
    return {s.labels["id"]: s.value for s in family.samples}  # type: ignore[attr-defined]


@pytest.mark.parametrize("v2", [True, False])
async def test_cadvisor_pressure_series(tmp_path: Path, v2: bool) -> None:
    snapshot = await provider(tmp_path, v2=v2).collect_cgroups()
    families = cadvisor_families(snapshot)
    node_io = parse_psi(fixture("node-io.pressure"))
    cgroup = parse_psi(CGROUP.read_text())
    assert node_io is not None and cgroup is not None
    io_waiting = samples(families, "container_pressure_io_waiting_seconds_total")
    mem_stalled = samples(families, "container_pressure_memory_stalled_seconds_total")
    if v2:
        assert io_waiting == {
            "/": node_io.some.total_us / 1e6,
            f"{POD}/c1": cgroup.some.total_us / 1e6,
        }
        assert mem_stalled[POD] == mem_stalled[f"{POD}/c1"] == 123.456789
    else:  # only the root, from /proc/pressure: no series for a v1 cgroup, not zeros
        assert io_waiting == {"/": node_io.some.total_us / 1e6}
        assert set(mem_stalled) == {"/"}
    for resource in ("cpu", "memory", "io"):
        for kind in ("waiting", "stalled"):
            name = f"container_pressure_{resource}_{kind}_seconds_total"
            [family] = [f for f in families if f.name == name.removesuffix("_total")]
            assert family.type == "counter" and "congestion" in family.documentation

"""Container and pod resources, oom_score_adj and pod cgroup files, table-driven; how
often the cgroupfs driver writes a pod's cgroup and the node's above it (counted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from klet.cri.types import LinuxResources
from klet.syncloop.containers import podcgroups
from klet.syncloop.model import resources
from klet.syncloop.model.resources import NodeLimits, PodResources

GI = 1024**3
NODE = NodeLimits(memory_capacity_bytes=4 * GI)


def c(
    name: str = "app", *, req: dict[str, str] | None = None, lim: dict[str, str] | None = None
) -> Any:
    res: dict[str, Any] = {}
    if req is not None:
        res["requests"] = req
    if lim is not None:
        res["limits"] = lim
    return {"name": name, "image": "x", "resources": res}


def pod(*containers: Any, init: tuple[Any, ...] = ()) -> Any:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "p", "uid": "u"}, "spec": spec}


@pytest.mark.parametrize(
    ("milli", "shares"),
    [(0, 2), (1, 2), (2, 2), (250, 256), (1000, 1024), (1500, 1536), (10**9, 262144)],
)
def test_milli_cpu_to_shares(milli: int, shares: int) -> None:
    assert resources.milli_cpu_to_shares(milli) == shares


@pytest.mark.parametrize(
    ("milli", "period", "quota"),
    [(0, 100000, 0), (1, 100000, 1000), (500, 100000, 50000), (2000, 50000, 100000)],
)
def test_milli_cpu_to_quota(milli: int, period: int, quota: int) -> None:
    assert resources.milli_cpu_to_quota(milli, period) == quota


BURSTABLE = c(req={"cpu": "250m", "memory": "64Mi"}, lim={"cpu": "500m", "memory": "128Mi"})
GUARANTEED = c(lim={"cpu": "1", "memory": "128Mi"})


@pytest.mark.parametrize(
    ("container", "node", "expected"),
    [
        (BURSTABLE, NODE, LinuxResources(256, 50000, 100000, 134217728, 1000 - 64 * 1000 // 4096)),
        (GUARANTEED, NODE, LinuxResources(1024, 100000, 100000, 134217728, -997)),
        (c(), NODE, LinuxResources(2, 0, 100000, 0, 1000)),
        # the request defaults to the limit
        (c(lim={"cpu": "300m"}), NODE, LinuxResources(307, 30000, 100000, 0, 999)),
        (c(req={"cpu": "100m"}), NODE, LinuxResources(102, 0, 100000, 0, 999)),
        # cpuCFSQuota off: no quota, no period
        (
            BURSTABLE,
            NodeLimits(4 * GI, cpu_cfs_quota=False),
            LinuxResources(256, 0, 0, 134217728, 985),
        ),
        # a 50 ms period
        (
            BURSTABLE,
            NodeLimits(4 * GI, cpu_cfs_quota_period_s=0.05),
            LinuxResources(256, 25000, 50000, 134217728, 985),
        ),
        # a host refusing negative values: clamped to its floor
        (
            GUARANTEED,
            NodeLimits(4 * GI, oom_score_adj_floor=0),
            LinuxResources(1024, 100000, 100000, 134217728, 0),
        ),
        # hugepages are ignored
        (
            c(
                req={"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "2Mi"},
                lim={"hugepages-2Mi": "2Mi"},
            ),
            NODE,
            LinuxResources(1024, 0, 100000, 0, 750),
        ),
    ],
)
def test_container_resources(container: Any, node: NodeLimits, expected: LinuxResources) -> None:
    assert resources.container_resources(pod(container), container, node) == expected


@pytest.mark.parametrize(
    ("memory_request", "capacity", "adj"),
    [
        ("1", 4 * GI, 999),  # 1000 would be best-effort's
        ("1Gi", 4 * GI, 750),
        ("4Gi", 4 * GI, 3),  # never as low as a guaranteed pod
        ("8Gi", 4 * GI, 3),
        ("3990Mi", 4 * GI, 26),
    ],
)
def test_burstable_oom_score_adj(memory_request: str, capacity: int, adj: int) -> None:
    container = c(req={"memory": memory_request, "cpu": "1"}, lim={"cpu": "2"})
    assert resources.oom_score_adj(pod(container), container, capacity) == adj


@pytest.mark.parametrize(
    ("adj", "floor", "out"), [(-997, -1000, -997), (-997, 0, 0), (5, 0, 5), (1000, 0, 1000)]
)
def test_clamp(adj: int, floor: int, out: int) -> None:
    assert resources.clamp_oom_score_adj(adj, floor) == out


@pytest.mark.parametrize(
    ("p", "node", "expected"),
    [
        (pod(BURSTABLE), NODE, PodResources(256, 50000, 100000, 134217728)),
        (pod(GUARANTEED, GUARANTEED), NODE, PodResources(2048, 200000, 100000, 268435456)),
        (pod(c()), NODE, PodResources(2, None, None, None)),
        # one container without limits: no pod quota and no pod memory limit
        (pod(BURSTABLE, c("b", req={"cpu": "250m"})), NODE, PodResources(512, None, None, None)),
        # cpu limits everywhere but not memory
        (
            pod(BURSTABLE, c("b", lim={"cpu": "500m"})),
            NODE,
            PodResources(768, 100000, 100000, None),
        ),
        # an init container larger than the sum wins
        (
            pod(BURSTABLE, init=(c("i", req={"cpu": "2"}, lim={"cpu": "2", "memory": "1Gi"}),)),
            NODE,
            PodResources(2048, 200000, 100000, GI),
        ),
        # cpuCFSQuota off: -1 (unlimited) for the pod
        (
            pod(GUARANTEED),
            NodeLimits(GI, cpu_cfs_quota=False),
            PodResources(1024, -1, 100000, 134217728),
        ),
        # podPidsLimit caps every QoS class; -1 and 0 leave pids unlimited
        (pod(c()), NodeLimits(GI, pod_pids_limit=100), PodResources(2, None, None, None, 100)),
        (
            pod(BURSTABLE),
            NodeLimits(GI, pod_pids_limit=5),
            PodResources(256, 50000, 100000, 134217728, 5),
        ),
        (
            pod(GUARANTEED),
            NodeLimits(GI, pod_pids_limit=1),
            PodResources(1024, 100000, 100000, 134217728, 1),
        ),
        (pod(c()), NodeLimits(GI, pod_pids_limit=-1), PodResources(2, None, None, None, None)),
        (pod(c()), NodeLimits(GI, pod_pids_limit=0), PodResources(2, None, None, None, None)),
    ],
)
def test_pod_resources(p: Any, node: NodeLimits, expected: PodResources) -> None:
    assert resources.pod_resources(p, node) == expected


def with_overhead(p: Any, **overhead: str) -> Any:
    p["spec"]["overhead"] = overhead
    return p


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        # requests and both limits grow by the overhead (a RuntimeClass's, 10m and 1Mi)
        (
            with_overhead(pod(GUARANTEED), cpu="100m", memory="1Mi"),
            PodResources(1126, 110000, 100000, 134217728 + 1048576),
        ),
        # no memory limit declared: none is made up from the overhead
        (
            with_overhead(pod(c(req={"cpu": "250m"})), cpu="10m", memory="1Mi"),
            PodResources(266, None, None, None),
        ),
        # a best-effort pod stays best-effort
        (with_overhead(pod(c()), cpu="10m"), PodResources(2, None, None, None)),
    ],
)
def test_the_pod_overhead_counts_in_the_pod_cgroup(p: Any, expected: PodResources) -> None:
    assert resources.pod_resources(p, NODE) == expected


def test_ensure_pod_cgroup_v1(tmp_path: Path) -> None:
    for ctrl in ("cpu", "memory", "pids", "cpuset"):
        (tmp_path / ctrl).mkdir()
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-3\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    kube = tmp_path / "cpuset" / "kubepods"
    kube.mkdir()
    (kube / "cpuset.cpus").write_text("")
    (kube / "cpuset.mems").write_text("")
    # An existing node cgroup left empty is the node's pass to repair, not a pod's.
    assert podcgroups.ensure_cgroup("/kubepods", {}, {}, root=tmp_path) == []
    res = PodResources(256, 50000, 100000, 134217728)
    for _ in range(2):  # idempotent
        assert podcgroups.ensure_pod_cgroup("/kubepods/burstable/podu", res, root=tmp_path) == []
    d = tmp_path / "cpu" / "kubepods" / "burstable" / "podu"
    assert (d / "cpu.shares").read_text() == "256"
    assert (d / "cpu.cfs_quota_us").read_text() == "50000"
    assert (d / "cpu.cfs_period_us").read_text() == "100000"
    mem = tmp_path / "memory" / "kubepods" / "burstable" / "podu"
    assert (mem / "memory.limit_in_bytes").read_text() == "134217728"
    assert (tmp_path / "pids/kubepods/burstable/podu/pids.max").read_text() == "max"
    assert (kube / "cpuset.cpus").read_text() == "0-3"
    assert (kube / "burstable" / "cpuset.mems").read_text() == "0"


def test_a_pods_cgroup_copies_the_cpuset_into_what_it_makes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cpuset is copied into each directory a pod's ensure makes and into the pod's
    own cgroup, never checked again in the node's cgroups above it, which their own
    pass keeps (issue 42: 3 copies per new pod, one per level of its path)."""
    copied: list[str] = []
    real = podcgroups._copy_cpuset

    def counting(d: Path, problems: list[str]) -> None:
        copied.append(str(d.relative_to(tmp_path / "cpuset")))
        real(d, problems)

    monkeypatch.setattr(podcgroups, "_copy_cpuset", counting)
    (tmp_path / "cpuset").mkdir()
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    res = PodResources(2, None, None, None)
    assert podcgroups.ensure_pod_cgroup("/kubepods/besteffort/poda", res, root=tmp_path) == []
    assert copied == ["kubepods", "kubepods/besteffort", "kubepods/besteffort/poda"]
    copied.clear()
    for uid in ("b", "c"):
        podcgroups.ensure_pod_cgroup(f"/kubepods/besteffort/pod{uid}", res, root=tmp_path)
    assert copied == ["kubepods/besteffort/podb", "kubepods/besteffort/podc"]
    assert (tmp_path / "cpuset/kubepods/besteffort/podc/cpuset.cpus").read_text() == "0-1"
    copied.clear()
    podcgroups.ensure_pod_cgroup("/kubepods/besteffort/podc", res, root=tmp_path)  # again
    assert copied == ["kubepods/besteffort/podc"]


def test_ensure_pod_cgroup_v1_unlimited(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "memory").mkdir()
    podcgroups.ensure_pod_cgroup(
        "/kubepods/besteffort/podu", PodResources(2, None, None, None), root=tmp_path
    )
    d = tmp_path / "cpu" / "kubepods" / "besteffort" / "podu"
    assert (d / "cpu.shares").read_text() == "2"
    assert (d / "cpu.cfs_quota_us").read_text() == "-1"
    assert not (d / "cpu.cfs_period_us").exists()
    assert (tmp_path / "memory/kubepods/besteffort/podu/memory.limit_in_bytes").read_text() == "-1"


def test_ensure_pod_cgroup_pids_limit(tmp_path: Path) -> None:
    """podPidsLimit reaches pids.max; a later unlimited pass lifts the cap again."""
    (tmp_path / "pids").mkdir()
    limited = PodResources(2, None, None, None, 42)
    assert podcgroups.ensure_pod_cgroup("/kubepods/besteffort/podu", limited, root=tmp_path) == []
    pids_max = tmp_path / "pids/kubepods/besteffort/podu/pids.max"
    assert pids_max.read_text() == "42"
    podcgroups.ensure_pod_cgroup(
        "/kubepods/besteffort/podu", PodResources(2, None, None, None), root=tmp_path
    )
    assert pids_max.read_text() == "max"


def test_node_limits_reads_pod_pids_limit() -> None:
    from klet.syncloop.containers.syncsettings import SyncSettings

    assert podcgroups.node_limits(SyncSettings(Path("/l"), pod_pids_limit=7)).pod_pids_limit == 7
    assert podcgroups.node_limits(SyncSettings(Path("/l"))).pod_pids_limit == -1


def test_ensure_pod_cgroup_v2(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    podcgroups.ensure_pod_cgroup(
        "/kubepods/podu", PodResources(1024, 100000, 100000, GI, 64), root=tmp_path
    )
    d = tmp_path / "kubepods" / "podu"
    assert (d / "pids.max").read_text() == "64"
    assert (d / "cpu.weight").read_text() == str(podcgroups.shares_to_weight(1024))
    assert (d / "cpu.max").read_text() == "100000 100000"
    assert (d / "memory.max").read_text() == str(GI)
    assert podcgroups.shares_to_weight(2) == 1 and podcgroups.shares_to_weight(262144) == 10000


def test_oom_floor_probe(tmp_path: Path) -> None:
    f = tmp_path / "oom_score_adj"
    f.write_text("0\n")
    assert podcgroups.oom_score_adj_floor(f) == -1000  # a plain file accepts -1
    assert f.read_text() == "0"
    f.write_text("-500\n")
    assert podcgroups.oom_score_adj_floor(f) == -1000
    assert podcgroups.oom_score_adj_floor(tmp_path / "missing") == 0


def test_oom_floor_refused(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    assert podcgroups.oom_score_adj_floor(d) == 0  # unreadable: 0


GIB = 1 << 30


def _machine(**kw: Any) -> Any:
    from klet.model.node import MachineInfo

    return MachineInfo(cpus=2, memory_bytes=8 * GIB, ephemeral_storage_bytes=100 * GIB, **kw)


def test_pods_cgroup_amounts_enforce_allocatable_without_the_eviction_threshold() -> None:
    """enforceNodeAllocatable [pods]: capacity − kubeReserved − systemReserved (upstream's
    GetNodeAllocatableAbsolute), memory also less the huge pages; no eviction threshold."""
    from klet.model.node import pods_cgroup_amounts

    amounts = pods_cgroup_amounts(
        _machine(hugepages={2 << 20: 512 << 20}),
        pid_max=4194304,
        kube_reserved={"cpu": "250m", "memory": "1Gi", "pid": "1000"},
        system_reserved={"cpu": "0.5", "memory": "512Mi"},
        enforce_pods=True,
    )
    assert amounts == {
        "cpu": 1250,
        "memory": 8 * GIB - GIB - (512 << 20) - (512 << 20),
        "pid": 4194304 - 1000,
        "hugepages-2Mi": 512 << 20,
    }
    limits = podcgroups.NodeCgroupLimits.of("/n1", amounts)
    assert limits.cpu_shares == 1280  # MilliCPUToShares(1250)
    assert limits.hugepages == (("2MB", 512 << 20),)


def test_pods_cgroup_amounts_without_enforcement_are_the_capacity() -> None:
    from klet.model.node import pods_cgroup_amounts

    amounts = pods_cgroup_amounts(
        _machine(),
        pid_max=None,
        kube_reserved={"memory": "1Gi"},
        system_reserved={},
        enforce_pods=False,
    )
    assert amounts == {"cpu": 2000, "memory": 8 * GIB}
    assert podcgroups.NodeCgroupLimits.of("/", amounts).pids is None


def test_pods_cgroup_amounts_never_below_zero() -> None:
    from klet.model.node import pods_cgroup_amounts

    amounts = pods_cgroup_amounts(
        _machine(),
        pid_max=100,
        kube_reserved={"cpu": "3", "memory": "9Gi", "pid": "200"},
        system_reserved={},
        enforce_pods=True,
    )
    assert amounts == {"cpu": 0, "memory": 0, "pid": 0}


def test_ensure_node_cgroups_v1(tmp_path: Path) -> None:
    for ctrl in ("cpu", "memory", "pids"):
        (tmp_path / ctrl).mkdir()
    node = podcgroups.NodeCgroupLimits("/n1", cpu_shares=1280, memory_bytes=6 * GIB, pids=4000)
    for _ in range(2):  # idempotent
        assert podcgroups.ensure_node_cgroups(node, tmp_path) == []
    top = "n1/kubepods"
    assert (tmp_path / "cpu" / top / "cpu.shares").read_text() == "1280"
    assert (tmp_path / "memory" / top / "memory.limit_in_bytes").read_text() == str(6 * GIB)
    assert (tmp_path / "pids" / top / "pids.max").read_text() == "4000"
    assert (tmp_path / "cpu" / top / "besteffort" / "cpu.shares").read_text() == "2"
    assert (tmp_path / "cpu" / top / "burstable").is_dir()
    assert not (tmp_path / "cpu" / top / "burstable" / "cpu.shares").exists()


def test_ensure_node_cgroups_v2(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    node = podcgroups.NodeCgroupLimits("/", cpu_shares=2048, memory_bytes=GIB, pids=None)
    assert podcgroups.ensure_node_cgroups(node, tmp_path) == []
    assert (tmp_path / "kubepods" / "cpu.weight").read_text() == str(
        podcgroups.shares_to_weight(2048)
    )
    assert (tmp_path / "kubepods" / "memory.max").read_text() == str(GIB)
    assert (tmp_path / "kubepods" / "pids.max").read_text() == "max"
    assert (tmp_path / "kubepods" / "besteffort" / "cpu.weight").read_text() == "1"


def _pod(qos_resources: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "resources": r} for i, r in enumerate(qos_resources)]
    return {"metadata": {"uid": "u"}, "spec": {"containers": containers, **spec}}


def test_burstable_cpu_shares_sum_the_burstable_pods_requests() -> None:
    """Upstream's QoS manager: the Burstable pods' CPU requests (init containers and
    overhead counted as PodRequests does) summed as shares; Guaranteed and BestEffort
    pods do not count; no Burstable pod leaves the minimum."""
    burstable = _pod([{"requests": {"cpu": "250m"}}, {"requests": {"cpu": "250m"}}])
    with_init = _pod(
        [{"requests": {"cpu": "100m"}}],
        initContainers=[{"name": "i", "resources": {"requests": {"cpu": "1"}}}],
        overhead={"cpu": "50m"},
    )
    guaranteed = _pod([{"limits": {"cpu": "2", "memory": "1Gi"}}])
    besteffort = _pod([{}])
    assert resources.pod_cpu_request_millis(with_init) == 1050
    assert resources.burstable_cpu_shares([burstable, with_init, guaranteed, besteffort]) == (
        1550 * 1024 // 1000
    )
    assert resources.burstable_cpu_shares([guaranteed, besteffort]) == resources.MIN_SHARES


def test_update_qos_writes_the_burstable_shares(tmp_path: Path) -> None:
    import asyncio

    from klet.cgroups import CgroupFS

    (tmp_path / "cpu").mkdir()
    node = podcgroups.NodeCgroupLimits("/n1", cpu_shares=2048, memory_bytes=GIB, pids=None)
    driver = podcgroups.CgroupfsPodCgroups(CgroupFS(tmp_path), node)
    assert asyncio.run(driver.update_qos(512)) == []
    assert (tmp_path / "cpu/n1/kubepods/burstable/cpu.shares").read_text() == "512"


def test_a_pod_cgroup_is_written_once_per_change_of_its_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sync of a pod ensures its cgroup: the files are written again only when
    the limits change, the cgroup is gone, ENSURE_RECHECK_S passed, or the last time
    met problems (a pod synced several times in a burst used to rewrite them all)."""
    import asyncio

    from klet.cgroups import CgroupFS

    writes: list[str] = []
    problems: list[str] = []

    def counting(parent: str, res: PodResources, root: Path) -> list[str]:
        writes.append(parent)
        for ctrl in ("cpu", "memory"):
            (root / ctrl / parent.strip("/")).mkdir(parents=True, exist_ok=True)
        return list(problems)

    monkeypatch.setattr(podcgroups, "ensure_pod_cgroup", counting)
    monkeypatch.setattr(podcgroups, "_mounted", lambda base: True)
    for ctrl in ("cpu", "memory"):
        (tmp_path / ctrl).mkdir()
    now = [100.0]
    driver = podcgroups.CgroupfsPodCgroups(CgroupFS(tmp_path), clock=lambda: now[0])
    res = PodResources(256, None, None, None)
    name = "/kubepods/burstable/podu1"

    def ensure(r: PodResources) -> tuple[bool, list[str]]:
        return asyncio.run(driver.ensure(name, r))

    assert ensure(res) == (False, []) and len(writes) == 1
    assert ensure(res) == (True, []) and len(writes) == 1  # nothing changed
    ensure(PodResources(512, None, None, None))  # new limits
    assert len(writes) == 2
    now[0] += podcgroups.ENSURE_RECHECK_S
    ensure(PodResources(512, None, None, None))  # due again
    assert len(writes) == 3
    for ctrl in ("cpu", "memory"):
        (tmp_path / ctrl / name.strip("/")).rmdir()
    problems.append("EROFS")
    ensure(PodResources(512, None, None, None))  # gone: made again, with a problem
    assert len(writes) == 4
    ensure(PodResources(512, None, None, None))  # a failed one is tried again at once
    assert len(writes) == 5
    problems.clear()
    ensure(PodResources(512, None, None, None))
    ensure(PodResources(512, None, None, None))
    assert len(writes) == 6


def test_the_node_cgroups_are_ensured_once_for_a_burst_of_new_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every new pod's cgroup is made, but the node's cgroups above them are checked at
    most once per ENSURE_RECHECK_S, whichever pod asks, and again at once after a
    problem (issue 42: a burst of 10 checked them 10 times)."""
    import asyncio

    from klet.cgroups import CgroupFS

    node_writes: list[str] = []
    pod_writes: list[str] = []
    problems: list[str] = []

    def node_counting(limits: podcgroups.NodeCgroupLimits, root: Path) -> list[str]:
        node_writes.append(limits.cgroup_root)
        return list(problems)

    def pod_counting(parent: str, res: PodResources, root: Path) -> list[str]:
        pod_writes.append(parent)
        return []

    monkeypatch.setattr(podcgroups, "ensure_node_cgroups", node_counting)
    monkeypatch.setattr(podcgroups, "ensure_pod_cgroup", pod_counting)
    now = [100.0]
    node = podcgroups.NodeCgroupLimits("/n1", cpu_shares=1280, memory_bytes=GIB, pids=None)
    driver = podcgroups.CgroupfsPodCgroups(CgroupFS(tmp_path), node, clock=lambda: now[0])
    res = PodResources(256, None, None, None)

    def burst(first: int, n: int) -> None:
        for i in range(first, first + n):
            asyncio.run(driver.ensure(f"/n1/kubepods/burstable/podu{i}", res))

    burst(0, 10)
    assert len(pod_writes) == 10 and len(node_writes) == 1
    now[0] += podcgroups.ENSURE_RECHECK_S - 1
    burst(10, 5)
    assert len(pod_writes) == 15 and len(node_writes) == 1
    now[0] += 1  # due again
    burst(15, 2)
    assert len(node_writes) == 2
    problems.append("memory.limit_in_bytes: Device or resource busy")
    now[0] += podcgroups.ENSURE_RECHECK_S
    burst(17, 2)  # refused: tried again by the next pod
    assert len(node_writes) == 4
    problems.clear()
    burst(19, 1)
    burst(20, 3)
    assert len(node_writes) == 5 and len(pod_writes) == 23


# --- huge pages and swap (NoSwap) -------------------------------------------------

MI2 = 2 << 20
PAGES = NodeLimits(memory_capacity_bytes=4 * GI, hugepage_sizes=(MI2, GI))


@pytest.mark.parametrize(
    ("size", "name"), [(MI2, "2MB"), (GI, "1GB"), (64 << 10, "64KB"), (16 * GI, "16GB")]
)
def test_hugepage_size_name(size: int, name: str) -> None:
    assert resources.hugepage_size_name(size) == name


def test_every_page_size_is_limited_and_zero_unless_asked_for() -> None:
    asks = c(lim={"cpu": "1", "memory": "128Mi", "hugepages-2Mi": "8Mi"})
    r = resources.container_resources(pod(asks), asks, PAGES)
    assert r.hugepage_limits == (("2MB", 8 << 20), ("1GB", 0))
    plain = c()
    assert resources.container_resources(pod(plain), plain, PAGES).hugepage_limits == (
        ("2MB", 0),
        ("1GB", 0),
    )
    # A kernel without huge pages: nothing to limit.
    assert resources.container_resources(pod(plain), plain, NODE).hugepage_limits == ()


def test_the_pod_cgroup_holds_its_containers_huge_pages() -> None:
    a = c("a", lim={"cpu": "1", "memory": "64Mi", "hugepages-2Mi": "4Mi"})
    b = c("b", lim={"cpu": "1", "memory": "64Mi", "hugepages-2Mi": "6Mi"})
    init = c("i", lim={"cpu": "1", "memory": "64Mi", "hugepages-2Mi": "20Mi"})
    assert resources.pod_resources(pod(a, b), PAGES).hugepage_limits == (
        ("2MB", 10 << 20),
        ("1GB", 0),
    )
    assert resources.pod_resources(pod(a, b, init=(init,)), PAGES).hugepage_limits == (
        ("2MB", 20 << 20),
        ("1GB", 0),
    )
    assert resources.pod_resources(pod(c()), PAGES).hugepage_limits == (("2MB", 0), ("1GB", 0))


@pytest.mark.parametrize(
    ("control", "swap_limit", "unified"),
    [("memsw", 128 << 20, {}), ("swap.max", 0, {"memory.swap.max": "0"}), ("", 0, {})],
)
def test_no_swap(control: str, swap_limit: int, unified: dict[str, str]) -> None:
    node = NodeLimits(memory_capacity_bytes=4 * GI, swap_control=control)
    r = resources.container_resources(pod(GUARANTEED), GUARANTEED, node)
    assert (r.memory_swap_limit_bytes, r.unified) == (swap_limit, unified)
    # Without a memory limit there is no memory+swap limit on v1 (upstream: the same).
    plain = c()
    assert resources.container_resources(pod(plain), plain, node).memory_swap_limit_bytes == 0


def test_swap_control_is_found_as_upstream(tmp_path: Path) -> None:
    from klet.cgroups.fs import swap_control

    (tmp_path / "memory").mkdir()
    assert swap_control(tmp_path) == ""
    (tmp_path / "memory/memory.memsw.limit_in_bytes").write_text("9223372036854771712\n")
    assert swap_control(tmp_path) == "memsw"
    v2 = tmp_path / "v2"
    (v2 / "klet.slice").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/klet.slice\n")
    assert swap_control(v2, own) == ""
    (v2 / "klet.slice/memory.swap.max").write_text("max\n")
    assert swap_control(v2, own) == "swap.max"


def test_hugepage_sizes_of_the_kernel(tmp_path: Path) -> None:
    for name in ("hugepages-2048kB", "hugepages-1048576kB", "not-a-size"):
        (tmp_path / name).mkdir()
    assert podcgroups.hugepage_sizes(tmp_path) == (MI2, GI)
    assert podcgroups.hugepage_sizes(tmp_path / "absent") == ()


def test_hugetlb_files_of_pods_kubepods_and_qos(tmp_path: Path) -> None:
    for ctrl in ("cpu", "memory", "hugetlb"):
        (tmp_path / ctrl).mkdir()
    res = PodResources(2, None, None, None, None, (("2MB", 4 << 20), ("1GB", 0)))
    assert podcgroups.ensure_pod_cgroup("/kubepods/besteffort/podu", res, root=tmp_path) == []
    d = tmp_path / "hugetlb/kubepods/besteffort/podu"
    assert (d / "hugetlb.2MB.limit_in_bytes").read_text() == str(4 << 20)
    assert (d / "hugetlb.1GB.limit_in_bytes").read_text() == "0"
    node = podcgroups.NodeCgroupLimits.of(
        "/", {"cpu": 2000, "memory": 8 * GI, "hugepages-2Mi": 64 << 20, "hugepages-1Gi": 0}
    )
    assert podcgroups.ensure_node_cgroups(node, tmp_path) == []
    kubepods = tmp_path / "hugetlb/kubepods"
    assert (kubepods / "hugetlb.2MB.limit_in_bytes").read_text() == str(64 << 20)
    assert (kubepods / "hugetlb.1GB.limit_in_bytes").read_text() == "0"
    for qos in ("burstable", "besteffort"):
        assert (kubepods / qos / "hugetlb.2MB.limit_in_bytes").read_text() == "-1"
    _, v2 = node.kubepods_files()
    assert v2["hugetlb.2MB.max"] == str(64 << 20)
    assert node.qos_hugetlb()[1] == {"hugetlb.2MB.max": "max", "hugetlb.1GB.max": "max"}


def test_a_hierarchy_the_host_does_not_mount_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a mounted cgroup root an empty directory is no hierarchy (these hosts'
    # hugetlb); a mounted one is. The tree of a unit test (no mount above) counts.
    root = tmp_path / "cgroup"
    for ctrl in ("cpu", "hugetlb"):
        (root / ctrl).mkdir(parents=True)
    assert podcgroups._mounted(root / "hugetlb")
    mounts = {root, root / "cpu"}
    monkeypatch.setattr(podcgroups.os.path, "ismount", lambda p: Path(p) in mounts)
    assert podcgroups._mounted(root / "cpu")
    assert not podcgroups._mounted(root / "hugetlb")
    res = PodResources(2, None, None, None, None, (("2MB", 0),))
    assert podcgroups.ensure_pod_cgroup("/kubepods/podu", res, root=root) == []
    assert not (root / "hugetlb" / "kubepods").exists()
    assert (root / "cpu/kubepods/podu/cpu.shares").read_text() == "2"


def test_the_cri_request_carries_swap_huge_pages_and_unified() -> None:
    from klet.cri.client import _container_pb
    from klet.cri.types import ContainerConfig

    r = LinuxResources(
        memory_limit_bytes=1 << 27,
        memory_swap_limit_bytes=1 << 27,
        hugepage_limits=(("2MB", 4 << 20), ("1GB", 0)),
        unified={"memory.swap.max": "0"},
    )
    sent = _container_pb(ContainerConfig("c", 0, "img", resources=r)).linux.resources
    assert sent.memory_swap_limit_in_bytes == 1 << 27
    assert [(h.page_size, h.limit) for h in sent.hugepage_limits] == [
        ("2MB", 4 << 20),
        ("1GB", 0),
    ]
    assert dict(sent.unified) == {"memory.swap.max": "0"}


def test_hugetlb_is_available_where_the_host_has_the_controller(tmp_path: Path) -> None:
    from klet.cgroups.fs import hugetlb_available

    (tmp_path / "hugetlb").mkdir()  # an empty directory, not a mounted hierarchy
    assert not hugetlb_available(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    assert not hugetlb_available(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu hugetlb memory pids\n")
    assert hugetlb_available(tmp_path)

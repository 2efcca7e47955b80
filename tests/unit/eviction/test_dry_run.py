"""The eviction dry-run (`klet evict --dry-run`): `EvictionManager.dry_run` answers what
`run_once` would do, with every signal against its thresholds, the pods in ranking
order with the reason for each place, the first non-critical one marked with the
message and grace it would get, node-level reclaim named first for disk, local storage
violators ahead of pressure, soft thresholds still in their grace period; and acts on
nothing: no kill, no FreeSpace, no condition or event, no metric, no state carried into
the next real pass. Hypothetical thresholds (`parse_expressions`) parse as evictionHard
does, get the configured minimum reclaim and the allocatable twin, and a bad one is
refused naming `--signal`; `ranking.rank_reason` explains each sort key;
`DryRunBackend` turns a refusal into `InvalidRequest`."""

from __future__ import annotations

import dataclasses

import pytest
from klet.config.errors import ConfigError
from klet.config.kubelet import KubeletConfiguration
from klet.eviction.dryrun import DryRunBackend
from klet.eviction.ranking import Candidate, rank_reason
from klet.eviction.signals import Signal
from klet.eviction.thresholds import Amount, Threshold, parse_expressions
from klet.rpc.eviction import InvalidRequest

from tests.unit.eviction.test_manager import (
    GI,
    MEMORY,
    MI,
    NODEFS,
    Layout,
    World,
    usage,
    with_request,
)


def untouched(w: World) -> None:
    assert w.killer.calls == [] and w.frees == [] and w.events == []
    assert w.bus.rows(w.node_bus.conditions) == {}
    assert w.registry.get_sample_value("klet_eviction_passes_total") == 0.0
    assert w.manager.last_observations == {} and w.manager.passes == 0
    signals = {"eviction_signal": "memory.available"}
    assert w.registry.get_sample_value("klet_eviction_signal_available", signals) is None


async def test_memory_pressure_ranks_and_marks_the_pod_it_would_evict() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add("calm", usage("calm", memory_working_set=200 * MI), containers=with_request("1Gi"))
    w.add(
        "hog",
        usage("hog", memory_working_set=500 * MI, containers={"c": 500 * MI}),
        containers=with_request("64Mi"),
    )
    w.add(
        "static",
        usage("static", memory_working_set=900 * MI),
        annotations={"kubernetes.io/config.source": "file"},
    )

    r = await w.manager.dry_run()

    untouched(w)
    assert r.signal == "memory.available" and r.reclaim_bytes == 0
    assert r.conditions == ("MemoryPressure",)
    assert [(p.pod, p.evict, p.critical) for p in r.pods] == [
        ("ns/static", False, True),
        ("ns/hog", True, False),
        ("ns/calm", False, False),
    ]
    hog = r.pods[1]
    assert hog.grace_period_s == 1
    assert hog.message.startswith("The node was low on resource: memory. Threshold quantity: 100Mi")
    assert hog.reason == "memory working set 500Mi, over its request 64Mi by 436Mi, priority 0"
    assert r.pods[2].reason == "memory working set 200Mi, within its request 1Gi, priority 0"
    assert r.summary == "memory.available is met: would evict ns/hog (one pod per pass)"
    [reading] = [s for s in r.signals if s.signal == "memory.available"]
    assert (reading.available, reading.threshold_value, reading.crossed, reading.met) == (
        50 * MI,
        100 * MI,
        True,
        True,
    )
    # the real pass then does exactly that, from a state the dry-run did not touch
    assert await w.step() == ["uid-hog"]


async def test_no_pressure_and_a_hypothetical_threshold() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 3 * GI
    w.source.capacity[Signal.MEMORY_AVAILABLE] = 8 * GI
    w.add("a", usage("a", memory_working_set=300 * MI))
    assert (await w.manager.dry_run()).summary == "no threshold is met: nothing would be evicted"

    cfg = KubeletConfiguration()
    what_if = parse_expressions(["memory.available<4Gi"], cfg)
    r = await w.manager.dry_run(what_if)
    assert r.thresholds[0] == "memory.available<4Gi (hard)"
    assert [p.pod for p in r.pods if p.evict] == ["ns/a"]
    untouched(w)
    assert await w.step() == []  # the configured 100Mi still rules the real pass


async def test_given_thresholds_replace_the_configured_ones_and_their_state() -> None:
    w = World(NODEFS)
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    w.source.available[Signal.MEMORY_AVAILABLE] = 3 * GI
    await w.step()  # NODEFS met; it stays met until 1.5Gi are available
    w.source.available[Signal.NODEFS_AVAILABLE] = 1200 * MI
    assert (await w.manager.dry_run()).signal == "nodefs.available"
    what_if = await w.manager.dry_run(
        parse_expressions(["memory.available<1Gi"], KubeletConfiguration())
    )
    assert what_if.signal == "" and [s.threshold for s in what_if.signals if s.met] == []


async def test_disk_pressure_names_node_level_reclaim_first() -> None:
    w = World(NODEFS)
    w.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    w.add("writer", usage("writer", ephemeral_storage=300 * MI))
    r = await w.manager.dry_run()
    # back to 1Gi plus the 512Mi minimum reclaim from 800Mi
    assert r.reclaim_bytes == 1536 * MI - 800 * MI
    assert r.summary.startswith("nodefs.available is met: would ask image-gc to free")
    assert r.pods[0].reason == "disk usage 300Mi, no request, priority 0"
    untouched(w)

    dedicated = World(NODEFS, layout=Layout(dedicated_image_fs=True))
    dedicated.source.available[Signal.NODEFS_AVAILABLE] = 800 * MI
    assert (await dedicated.manager.dry_run()).reclaim_bytes == 0


async def test_soft_threshold_in_its_grace_period_evicts_nobody() -> None:
    soft = Threshold(Signal.MEMORY_AVAILABLE, 100 * MI, None, grace_period_s=60)
    w = World(soft)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add("a", usage("a", memory_working_set=300 * MI))
    r = await w.manager.dry_run()
    assert r.pods == () and r.summary.startswith("no threshold past its grace period; crossed")
    assert r.conditions == ("MemoryPressure",)
    assert w.manager.state.first_observed == {}  # the grace period did not start


async def test_local_storage_violators_come_first() -> None:
    w = World(MEMORY)
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    w.add(
        "full",
        usage("full", volumes={"scratch": 20 * MI}),
        volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}],
    )
    r = await w.manager.dry_run()
    assert [(p.pod, p.evict) for p in r.pods] == [("ns/full", True)]
    assert r.pods[0].message == 'Usage of EmptyDir volume "scratch" exceeds the limit "10Mi". '
    assert "local storage limits" in r.summary
    untouched(w)


def test_parse_expressions_as_eviction_hard() -> None:
    cfg = dataclasses.replace(
        KubeletConfiguration(),
        eviction_minimum_reclaim={"nodefs.available": "1Gi"},
        enforce_node_allocatable=("pods",),
    )
    got = parse_expressions(["memory.available<2Gi,nodefs.available<10%"], cfg)
    assert got == [
        Threshold(Signal.MEMORY_AVAILABLE, 2 * GI, None),
        Threshold(Signal.NODEFS_AVAILABLE, None, 10.0, min_reclaim=Amount(quantity=GI)),
        Threshold(Signal.ALLOCATABLE_MEMORY_AVAILABLE, 2 * GI, None),
    ]


@pytest.mark.parametrize(
    ("expressions", "problem"),
    [
        (["memory.available"], 'malformed pair "memory.available", expected signal<value'),
        (["memory.avail<1Gi"], "--signal.memory.avail: unsupported eviction signal"),
        (["memory.available<-1"], "--signal.memory.available: eviction threshold"),
        (["memory.available<lots"], "--signal.memory.available"),
        (["memory.available<0%"], "--signal: no threshold"),
    ],
)
def test_parse_expressions_refuses_naming_the_flag(expressions: list[str], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_expressions(expressions, KubeletConfiguration())
    assert problem in "; ".join(err.value.problems)


async def test_backend_refuses_a_bad_threshold_before_measuring() -> None:
    w = World(MEMORY)
    backend = DryRunBackend(w.manager, KubeletConfiguration())
    with pytest.raises(InvalidRequest, match="--signal.pid.available"):
        await backend.dry_run(["pid.available<-5"])
    assert w.source.calls == 0
    w.source.available[Signal.MEMORY_AVAILABLE] = 50 * MI
    assert (await backend.dry_run([])).signal == "memory.available"


def pod(name: str, *, priority: int = 0, **requests: str) -> dict[str, object]:
    res = {"requests": requests} if requests else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {"priority": priority, "containers": [{"name": "c", "resources": res}]},
    }


@pytest.mark.parametrize(
    ("signal", "candidate", "reason"),
    [
        (
            Signal.MEMORY_AVAILABLE,
            Candidate(pod("a"), None),
            "no usage sample yet (sorts first), priority 0",
        ),
        (
            Signal.PID_AVAILABLE,
            Candidate(pod("a", priority=5), usage("a", processes=40)),
            "priority 5, 40 processes",
        ),
        (
            Signal.NODEFS_INODES_FREE,
            Candidate(pod("a"), usage("a", inodes=1200)),
            "1200 inodes used, priority 0",
        ),
        (
            Signal.NODEFS_AVAILABLE,
            Candidate(
                pod("a", **{"ephemeral-storage": "1Gi"}), usage("a", ephemeral_storage=GI // 2)
            ),
            "disk usage 512Mi, within its request 1Gi, priority 0",
        ),
        (
            Signal.MEMORY_AVAILABLE,
            Candidate(
                pod("a", priority=-3, memory="100Mi"), usage("a", memory_working_set=150 * MI)
            ),
            "memory working set 150Mi, over its request 100Mi by 50Mi, priority -3",
        ),
    ],
)
def test_rank_reason(signal: Signal, candidate: Candidate, reason: str) -> None:
    assert rank_reason(signal, candidate, layout=Layout()) == reason

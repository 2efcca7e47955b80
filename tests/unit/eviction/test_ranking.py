"""Eviction ranking and messages (ranking.py), table-driven.

Covers: the memory order (over requests first, then lower priority, then usage above
request; a pod without a sample first), the disk order with the filesystem layout
deciding what counts (shared filesystem, dedicated image filesystem, split container
filesystem) and inodes, the PID order (priority first, then process count); which
signals node-level reclaim serves per layout; memory signals first among thresholds;
upstream's eviction message with per-container lines and quantity formatting; the local
storage limits (emptyDir sizeLimit, the pod's summed ephemeral-storage limit, a
container's own limit) with upstream's messages; which pods a monitoring pass measures
(only those a limit applies to without pressure, and a pod left out can never be found
over a limit: issue 42).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from klet.eviction import ranking
from klet.eviction.ranking import Candidate
from klet.eviction.signals import PodUsage, Signal
from klet.model.types import JSON

MI = 1024**2
GI = 1024**3


@dataclass(frozen=True)
class Layout:
    dedicated_image_fs: bool = False
    split_container_fs: bool = False


SHARED = Layout()
IMAGEFS = Layout(dedicated_image_fs=True)
SPLIT = Layout(dedicated_image_fs=True, split_container_fs=True)


def pod(
    name: str,
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    priority: int | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    resources: JSON = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    out: JSON = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": annotations or {"kubernetes.io/config.source": "api"},
        },
        "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}], **spec},
    }
    if priority is not None:
        out["spec"]["priority"] = priority
    return out


def usage(
    name: str,
    *,
    memory: int = 0,
    processes: int = 0,
    writable: int = 0,
    logs: int = 0,
    volumes: dict[str, int] | None = None,
    inodes: int = 0,
    containers: dict[str, int] | None = None,
    storage: dict[str, int] | None = None,
) -> PodUsage:
    vols = volumes or {}
    return PodUsage(
        uid=f"uid-{name}",
        namespace="default",
        name=name,
        memory_working_set=memory,
        ephemeral_storage=writable + logs + sum(vols.values()),
        processes=processes,
        containers=containers or {"c": memory},
        writable_layer=writable,
        logs=logs,
        volumes=vols,
        container_storage=storage or {"c": writable + logs},
        inodes=inodes,
    )


def names(ranked: list[Candidate]) -> list[str]:
    return [c.pod["metadata"]["name"] for c in ranked]


@pytest.mark.parametrize(
    ("case", "pods", "expected"),
    [
        (
            "over requests before within requests, even when the latter uses more",
            [
                (pod("within", requests={"memory": "1Gi"}), usage("within", memory=900 * MI)),
                (pod("over", requests={"memory": "10Mi"}), usage("over", memory=20 * MI)),
            ],
            ["over", "within"],
        ),
        (
            "among pods over requests, lower priority first",
            [
                (pod("high", priority=1000), usage("high", memory=900 * MI)),
                (pod("low", priority=-5), usage("low", memory=10 * MI)),
                (pod("mid"), usage("mid", memory=500 * MI)),
            ],
            ["low", "mid", "high"],
        ),
        (
            "same priority: the most above its request first",
            [
                (pod("a", requests={"memory": "100Mi"}), usage("a", memory=300 * MI)),
                (pod("b"), usage("b", memory=150 * MI)),
                (pod("c", requests={"memory": "10Mi"}), usage("c", memory=250 * MI)),
            ],
            ["c", "a", "b"],
        ),
        (
            "within requests: priority, then usage relative to request",
            [
                (
                    pod("big", requests={"memory": "1Gi"}, priority=10),
                    usage("big", memory=900 * MI),
                ),
                (pod("p0a", requests={"memory": "1Gi"}), usage("p0a", memory=100 * MI)),
                (pod("p0b", requests={"memory": "200Mi"}), usage("p0b", memory=150 * MI)),
            ],
            ["p0b", "p0a", "big"],
        ),
        (
            "a pod without a sample first",
            [
                (pod("known"), usage("known", memory=900 * MI)),
                (pod("unknown", priority=100), None),
            ],
            ["unknown", "known"],
        ),
        (
            "limits are the default request",
            [
                (pod("limited", limits={"memory": "1Gi"}), usage("limited", memory=900 * MI)),
                (pod("free"), usage("free", memory=50 * MI)),
            ],
            ["free", "limited"],
        ),
    ],
)
def test_memory_ranking(
    case: str, pods: list[tuple[JSON, PodUsage | None]], expected: list[str]
) -> None:
    candidates = [Candidate(p, u) for p, u in pods]
    assert names(ranking.rank(Signal.MEMORY_AVAILABLE, candidates, layout=SHARED)) == expected, case
    assert (
        names(ranking.rank(Signal.ALLOCATABLE_MEMORY_AVAILABLE, candidates, layout=SHARED))
        == expected
    )


DISK_PODS = [
    (pod("writer"), usage("writer", writable=500 * MI, logs=1 * MI)),
    (pod("logger"), usage("logger", writable=1 * MI, logs=300 * MI)),
    (pod("volume"), usage("volume", volumes={"scratch": 400 * MI})),
]


@pytest.mark.parametrize(
    ("signal", "layout", "expected"),
    [
        (Signal.NODEFS_AVAILABLE, SHARED, ["writer", "volume", "logger"]),
        (Signal.IMAGEFS_AVAILABLE, SHARED, ["writer", "volume", "logger"]),
        # A dedicated image filesystem holds the writable layers: nodefs has logs and
        # emptyDirs, imagefs/containerfs the writable layers.
        (Signal.NODEFS_AVAILABLE, IMAGEFS, ["volume", "logger", "writer"]),
        (Signal.IMAGEFS_AVAILABLE, IMAGEFS, ["writer", "logger", "volume"]),
        (Signal.CONTAINERFS_AVAILABLE, IMAGEFS, ["writer", "logger", "volume"]),
        # Containers split from images: nodefs/containerfs hold all three.
        (Signal.CONTAINERFS_AVAILABLE, SPLIT, ["writer", "volume", "logger"]),
    ],
)
def test_disk_ranking_by_layout(signal: Signal, layout: Layout, expected: list[str]) -> None:
    candidates = [Candidate(p, u) for p, u in DISK_PODS]
    assert names(ranking.rank(signal, candidates, layout=layout)) == expected


def test_disk_ranking_requests_and_priority_first() -> None:
    candidates = [
        Candidate(
            pod("requested", requests={"ephemeral-storage": "1Gi"}),
            usage("requested", writable=900 * MI),
        ),
        Candidate(pod("small-low", priority=-1), usage("small-low", writable=10 * MI)),
        Candidate(pod("small"), usage("small", writable=20 * MI)),
    ]
    assert names(ranking.rank(Signal.NODEFS_AVAILABLE, candidates, layout=SHARED)) == [
        "small-low",
        "small",
        "requested",
    ]


def test_inode_ranking_counts_inodes() -> None:
    candidates = [
        Candidate(pod("few"), usage("few", writable=900 * MI, inodes=10)),
        Candidate(pod("many"), usage("many", writable=1 * MI, inodes=50_000)),
    ]
    for signal in (Signal.NODEFS_INODES_FREE, Signal.IMAGEFS_INODES_FREE):
        assert names(ranking.rank(signal, candidates, layout=SHARED)) == ["many", "few"]


def test_pid_ranking_is_priority_then_processes() -> None:
    candidates = [
        Candidate(pod("forky", priority=100), usage("forky", processes=5000)),
        Candidate(pod("few"), usage("few", processes=3)),
        Candidate(pod("more"), usage("more", processes=40)),
        Candidate(pod("nosample"), None),
    ]
    assert names(ranking.rank(Signal.PID_AVAILABLE, candidates, layout=SHARED)) == [
        "nosample",
        "more",
        "few",
        "forky",
    ]


@pytest.mark.parametrize(
    ("signal", "layout", "reclaims"),
    [
        (Signal.MEMORY_AVAILABLE, SHARED, False),
        (Signal.PID_AVAILABLE, SHARED, False),
        (Signal.NODEFS_AVAILABLE, SHARED, True),
        (Signal.NODEFS_INODES_FREE, SHARED, True),
        (Signal.IMAGEFS_AVAILABLE, SHARED, True),
        (Signal.NODEFS_AVAILABLE, IMAGEFS, False),
        (Signal.NODEFS_INODES_FREE, IMAGEFS, False),
        (Signal.IMAGEFS_AVAILABLE, IMAGEFS, True),
        (Signal.CONTAINERFS_AVAILABLE, IMAGEFS, True),
        (Signal.NODEFS_AVAILABLE, SPLIT, True),
        (Signal.IMAGEFS_AVAILABLE, SPLIT, True),
    ],
)
def test_node_level_reclaim_by_layout(signal: Signal, layout: Layout, reclaims: bool) -> None:
    assert ranking.reclaims_node_level(signal, layout=layout) is reclaims


def test_memory_signals_come_first() -> None:
    assert ranking.by_eviction_priority(
        [Signal.NODEFS_AVAILABLE, Signal.PID_AVAILABLE, Signal.ALLOCATABLE_MEMORY_AVAILABLE]
    ) == [Signal.ALLOCATABLE_MEMORY_AVAILABLE, Signal.NODEFS_AVAILABLE, Signal.PID_AVAILABLE]


def test_memory_eviction_message_names_the_containers_over_their_request() -> None:
    p = pod("hog")
    p["spec"]["containers"] = [
        {"name": "hog", "resources": {"requests": {"memory": "64Mi"}}},
        {"name": "calm", "resources": {"requests": {"memory": "100M"}}},
        {"name": "none"},
    ]
    u = usage("hog", memory=600 * MI, containers={"hog": 500 * MI, "calm": 10 * MI, "none": 12345})
    message = ranking.eviction_message(
        "memory", Candidate(p, u), threshold_quantity=100 * MI, available=50 * MI + 1
    )
    assert message == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52428801. "
        "Container hog was using 500Mi, request is 64Mi, has larger consumption of memory. "
        "Container none was using 12345, request is 0, has larger consumption of memory. "
    )


@pytest.mark.parametrize(
    ("resource", "quantity", "available", "expected"),
    [
        (
            "pids",
            1000,
            12,
            "The node was low on resource: pids. Threshold quantity: 1k, available: 12. ",
        ),
        (
            "inodes",
            5_000_000,
            1_500_000,
            "The node was low on resource: inodes. Threshold quantity: 5M, available: 1500k. ",
        ),
        ("memory", None, None, "The node was low on resource: memory. "),
    ],
)
def test_message_quantities(
    resource: str, quantity: int | None, available: int | None, expected: str
) -> None:
    c = Candidate(pod("p"), None)
    assert (
        ranking.eviction_message(resource, c, threshold_quantity=quantity, available=available)
        == expected
    )


def test_disk_eviction_message_uses_writable_layer_and_logs() -> None:
    p = pod("w", requests={"ephemeral-storage": "10Mi"})
    u = usage("w", writable=40 * MI, logs=2 * MI)
    assert ranking.eviction_message(
        "ephemeral-storage", Candidate(p, u), threshold_quantity=GI, available=512 * MI
    ) == (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, "
        "available: 512Mi. Container c was using 42Mi, request is 10Mi, has larger "
        "consumption of ephemeral-storage. "
    )


@pytest.mark.parametrize(
    ("case", "p", "u", "expected"),
    [
        (
            "emptyDir over its sizeLimit",
            pod("e", volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}]),
            usage("e", volumes={"scratch": 11 * MI}),
            ("emptydirfs.limit", 'Usage of EmptyDir volume "scratch" exceeds the limit "10Mi". '),
        ),
        (
            "emptyDir at its sizeLimit is fine",
            pod("e", volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}]),
            usage("e", volumes={"scratch": 10 * MI}),
            None,
        ),
        (
            "emptyDir without a sizeLimit",
            pod("e", volumes=[{"name": "scratch", "emptyDir": {}}]),
            usage("e", volumes={"scratch": 10 * GI}),
            None,
        ),
        (
            "pod over the sum of its containers' limits",
            pod("p", limits={"ephemeral-storage": "20Mi"}, volumes=[{"name": "v", "emptyDir": {}}]),
            usage("p", writable=5 * MI, volumes={"v": 16 * MI}),
            (
                "ephemeralpodfs.limit",
                "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ",
            ),
        ),
        (
            "a container over its own limit",
            {
                **pod("two"),
                "spec": {
                    "containers": [
                        {"name": "a", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
                        {"name": "b", "resources": {"limits": {"ephemeral-storage": "1Mi"}}},
                    ]
                },
            },
            usage("two", writable=3 * MI, storage={"a": 1 * MI, "b": 2 * MI}),
            (
                "ephemeralcontainerfs.limit",
                'Container b exceeded its local ephemeral storage limit "1Mi". ',
            ),
        ),
        (
            "within every limit",
            pod("ok", limits={"ephemeral-storage": "1Gi"}),
            usage("ok", writable=5 * MI),
            None,
        ),
    ],
)
def test_local_storage_violation(
    case: str, p: JSON, u: PodUsage, expected: tuple[str, str] | None
) -> None:
    found = ranking.local_storage_violation(p, u)
    got = None if found is None else (found.signal, found.message)
    assert got == expected, case


def empty_dir(**kw: str) -> list[JSON]:
    return [{"name": "scratch", "emptyDir": kw}]


HUGE = usage(
    "h", writable=100 * GI, logs=100 * GI, volumes={"scratch": 100 * GI},
    storage={"c": 200 * GI, "i": 200 * GI},
)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "p", "limited"),
    [
        ("no resources", pod("a"), False),
        ("requests only", pod("a", requests={"ephemeral-storage": "1Gi"}), False),
        ("an emptyDir without sizeLimit", pod("a", volumes=empty_dir()), False),
        ("an emptyDir sizeLimit of 0", pod("a", volumes=empty_dir(sizeLimit="0")), False),
        ("a hostPath", pod("a", volumes=[{"name": "scratch", "hostPath": {"path": "/x"}}]), False),
        ("an emptyDir sizeLimit", pod("a", volumes=empty_dir(sizeLimit="1Mi")), True),
        ("a container limit", pod("a", limits={"ephemeral-storage": "1Gi"}), True),
        ("a container limit of 0", pod("a", limits={"ephemeral-storage": "0"}), True),
        (
            "an init container limit",
            {**pod("a"), "spec": {"containers": [{"name": "c"}], "initContainers": [
                {"name": "i", "resources": {"limits": {"ephemeral-storage": "1Mi"}}}]}},
            True,
        ),
    ],
)  # fmt: skip
def test_only_a_pod_with_a_local_storage_limit_can_violate_one(
    case: str, p: JSON, limited: bool
) -> None:
    assert ranking.has_local_storage_limit(p) is limited, case
    if not limited:  # so a pass may leave it unmeasured: no usage finds it over a limit
        assert ranking.local_storage_violation(p, HUGE) is None, case
    assert ranking.pods_to_measure([p], ranking_needed=False) == (
        {"uid-a"} if limited else frozenset()
    ), case
    assert ranking.pods_to_measure([p], ranking_needed=True) is None, case  # every pod

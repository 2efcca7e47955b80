"""StaticPodGate (pods/staticpods.py), table-driven: static pods of one full name start
one at a time, in the order they were first seen; the started one stays allowed; a
waiting pod that is no longer wanted loses its place; the started one stopping frees
the name and names the pods to wake; other names are independent."""

from __future__ import annotations

import pytest
from klet.syncloop.pods.staticpods import StaticPodGate

NAME = "kube-system/etcd-node1"

# Steps: ("seen", uid), ("allow", uid, expected), ("stopped", uid, expected woken),
# ("unwanted", uid): from then on `wanted(uid)` is False.
Step = tuple[object, ...]


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([("seen", "a"), ("allow", "a", True), ("allow", "a", True)], id="one pod"),
        pytest.param(
            [
                ("seen", "old"),
                ("allow", "old", True),
                ("seen", "new"),
                ("allow", "new", False),
                ("allow", "old", True),
                ("stopped", "old", ["new"]),
                ("allow", "new", True),
                ("allow", "old", False),
            ],
            id="edited manifest: the new pod waits for the old one",
        ),
        pytest.param(
            [
                ("seen", "old"),
                ("allow", "old", True),
                ("seen", "v2"),
                ("seen", "v3"),
                ("unwanted", "v2"),
                ("stopped", "old", ["v2", "v3"]),
                ("allow", "v3", True),
            ],
            id="a version edited away before its turn loses its place",
        ),
        pytest.param(
            [
                ("seen", "v2"),
                ("seen", "v3"),
                ("allow", "v3", False),
                ("allow", "v2", True),
                ("stopped", "v2", ["v3"]),
                ("allow", "v3", True),
            ],
            id="first seen, first started",
        ),
        pytest.param(
            [("allow", "x", True), ("stopped", "x", []), ("allow", "y", True)],
            id="never queued: allowed when the name is free",
        ),
    ],
)
def test_static_pods_start_one_at_a_time_per_name(steps: list[Step]) -> None:
    gate = StaticPodGate()
    unwanted: set[str] = set()
    for step in steps:
        kind, uid = step[0], str(step[1])
        if kind == "seen":
            gate.seen(NAME, uid)
        elif kind == "unwanted":
            unwanted.add(uid)
        elif kind == "allow":
            assert gate.allow(NAME, uid, wanted=lambda u: u not in unwanted) is step[2], step
        else:
            assert gate.stopped(NAME, uid) == step[2], step


def test_names_are_independent() -> None:
    gate = StaticPodGate()
    gate.seen(NAME, "a")
    gate.seen("kube-system/other-node1", "b")
    assert gate.allow(NAME, "a", wanted=lambda u: True)
    assert gate.allow("kube-system/other-node1", "b", wanted=lambda u: True)

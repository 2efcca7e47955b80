"""`klet check-node` (the chart's helm test): the Ready + Lease decision, table-tested, and
the check loop against an in-memory apiserver that turns the node up after a while."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from klet.cli.checknode import check_node, check_node_cli, node_problems
from klet.kube import NotFound, Unavailable
from klet.model.timestamps import micro_time
from klet.model.types import JSON

NOW = 1_800_000_000.0


def node(ready: str | None = "True") -> JSON:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append(
            {"type": "Ready", "status": ready, "reason": "KubeletNotReady", "message": "m"}
        )
    return {"metadata": {"name": "n1"}, "status": {"conditions": conditions}}


def lease(age_s: float, duration: int = 40) -> JSON:
    return {"spec": {"renewTime": micro_time(NOW - age_s), "leaseDurationSeconds": duration}}


@pytest.mark.parametrize(
    ("the_node", "the_lease", "expected"),
    [
        (node(), lease(3), []),
        (node(), lease(40), []),
        (node(), lease(41), ["Lease renewed 41s ago, more than its 40s"]),
        (node("False"), lease(3), ["node Ready=False (KubeletNotReady: m)"]),
        (
            node("Unknown"),
            lease(100),
            [
                "node Ready=Unknown (KubeletNotReady: m)",
                "Lease renewed 100s ago, more than its 40s",
            ],
        ),
        (node(None), lease(1), ["node has no Ready condition"]),
        (None, None, ["node not registered", "no Lease in kube-node-lease"]),
        (node(), None, ["no Lease in kube-node-lease"]),
        (
            node(),
            {"spec": {"holderIdentity": "n1"}},
            ["Lease without renewTime or leaseDurationSeconds: {'holderIdentity': 'n1'}"],
        ),
        (
            node(),
            {"spec": {"renewTime": "yesterday", "leaseDurationSeconds": 40}},
            ["Lease renewTime unreadable: 'yesterday'"],
        ),
    ],
)
def test_node_problems(the_node: JSON | None, the_lease: JSON | None, expected: list[str]) -> None:
    assert node_problems(the_node, the_lease, now=NOW) == expected


def test_renew_time_with_an_offset_is_read() -> None:
    renewed = {
        "spec": {"renewTime": "2027-01-15T10:00:00.000000+01:00", "leaseDurationSeconds": 40}
    }
    utc = datetime(2027, 1, 15, 9, 0, 0, tzinfo=UTC).timestamp()
    assert node_problems(node(), renewed, now=utc + 10) == []
    assert node_problems(node(), renewed, now=utc + 41) == [
        "Lease renewed 41s ago, more than its 40s"
    ]


class FakeApiserver:
    """Answers GETs from a dict; a path not in it is NotFound, `fail` raises Unavailable."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.gets = 0
        self.fail = False
        self.on_get: Any = None

    async def get(self, path: str, **params: Any) -> Any:
        self.gets += 1
        if self.on_get is not None:
            self.on_get(self)
        if self.fail:
            raise Unavailable("connection refused")
        if path not in self.objects:
            raise NotFound(f"{path}: 404", status=404)
        return self.objects[path]


NODE_PATH = "/api/v1/nodes/n1"
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"


async def test_check_waits_until_the_node_is_up() -> None:
    api = FakeApiserver()

    def register_on_third_get(a: FakeApiserver) -> None:
        if a.gets == 3:
            a.objects[NODE_PATH] = node()
            a.objects[LEASE_PATH] = {
                "spec": {"renewTime": micro_time(time.time()), "leaseDurationSeconds": 40}
            }

    api.on_get = register_on_third_get
    assert await check_node(api, "n1", timeout_s=30, interval_s=0) == []
    assert api.gets >= 4


async def test_check_gives_the_last_reasons_at_the_timeout() -> None:
    api = FakeApiserver()
    api.fail = True
    problems = await check_node(api, "n1", timeout_s=0, interval_s=0)
    assert problems == ["apiserver: connection refused"]


def test_cli_refuses_a_missing_kubeconfig(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_node_cli(["--node", "n1", "--kubeconfig", str(tmp_path / "none")]) == 2
    assert "no file" in capsys.readouterr().err

"""`klet gc --dry-run` and `klet evict --dry-run` without the services: both plans
cross the gRPC adapters (PlanCollection, DryRun) intact over a unix socket, sizes
unknown included, and a refusal arrives as InvalidRequest; the tables and JSON print
what the plans hold; the socket is found under --run-dir, KLET_RUN_DIR or the defaults,
and a service that is not running is named with every path looked at (exit 1), as is
one whose socket nobody answers on; a malformed --signal is refused before any call
(exit 2); --dry-run is required; names and messages from pods show control characters
escaped."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import pytest
from klet.cli import dryrun
from klet.cli.dryrunview import as_json, evict_text, gc_text, human_bytes, signal_amount
from klet.cli.main import main
from klet.model.layout import EVICTION, IMAGE_GC, grpc_socket
from klet.rpc.eviction import (
    DryRunResult,
    EvictionClient,
    RankedPod,
    SignalReading,
    serve_eviction,
)
from klet.rpc.gc import (
    CollectionPlan,
    CollectResult,
    FreeSpaceResult,
    GarbageCollectorClient,
    InvalidRequest,
    PlannedRemoval,
    serve_garbage_collector,
)

PLAN = CollectionPlan(
    sources_ready=True,
    high_threshold_percent=50,
    low_threshold_percent=40,
    image_fs_capacity=100 << 20,
    image_fs_available=30 << 20,
    image_fs_usage_percent=70,
    image_fs_mountpoint="/var/lib/containerd",
    bytes_to_free=30 << 20,
    removals=(
        PlannedRemoval("container", "c" * 64, "main", "ns/web", "dead, pod gone", 4096),
        PlannedRemoval("sandbox", "s" * 64, "web", "ns/web", "inactive, pod gone", None),
        PlannedRemoval("log-dir", "ns_web_u1", "ns_web_u1", "ns/web", "pod gone", 100),
        PlannedRemoval(
            "image", "sha256:" + "a" * 64, "r/a:1", "", "space: least recently used", 12 << 20
        ),
    ),
    problem="",
)

RESULT = DryRunResult(
    signals=(
        SignalReading(
            "memory.available", 3 << 30, 8 << 30, "memory.available<4Gi (hard)", 4 << 30, True, True
        ),
        SignalReading("pid.available", 4_000_000, 4_194_304),
    ),
    conditions=("MemoryPressure",),
    signal="memory.available",
    reclaim_bytes=0,
    pods=(
        RankedPod("kube-system/etcd", "u0", "memory working set 1.0Gi", critical=True),
        RankedPod(
            "ns/hog",
            "u1",
            "memory working set 500Mi, no request, priority 0",
            evict=True,
            message="The node was low on resource: memory. ",
            grace_period_s=1,
        ),
    ),
    summary="memory.available is met: would evict ns/hog (one pod per pass)",
    thresholds=("memory.available<4Gi (hard)",),
)


class Backend:
    def __init__(self) -> None:
        self.asked: list[object] = []

    async def free_space(self, bytes_to_free: int) -> FreeSpaceResult:
        raise AssertionError("a dry-run must not free space")

    async def collect_now(self) -> CollectResult:
        raise AssertionError("a dry-run must not collect")

    async def plan_collection(self, high_threshold_percent: int | None) -> CollectionPlan:
        self.asked.append(high_threshold_percent)
        if high_threshold_percent == 101:
            raise InvalidRequest("--threshold 101: out of range")
        return PLAN

    async def dry_run(self, thresholds: Sequence[str]) -> DryRunResult:
        self.asked.append(list(thresholds))
        if thresholds == ["bad<1"]:
            raise InvalidRequest("--signal.bad: unsupported eviction signal bad")
        return RESULT


async def test_plans_cross_the_sockets_intact(tmp_path: Path) -> None:
    backend = Backend()
    gc_sock, ev_sock = grpc_socket(tmp_path, IMAGE_GC), grpc_socket(tmp_path, EVICTION)
    ready_gc, ready_ev = asyncio.Event(), asyncio.Event()
    servers = [
        asyncio.create_task(serve_garbage_collector(backend, gc_sock, ready=ready_gc)),
        asyncio.create_task(serve_eviction(backend, ev_sock, ready=ready_ev)),
    ]
    await asyncio.wait_for(asyncio.gather(ready_gc.wait(), ready_ev.wait()), 10)
    gc, ev = GarbageCollectorClient(gc_sock, timeout_s=10), EvictionClient(ev_sock, timeout_s=10)
    try:
        assert await gc.plan_collection() == PLAN
        assert await gc.plan_collection(high_threshold_percent=0) == PLAN
        with pytest.raises(InvalidRequest, match="out of range"):
            await gc.plan_collection(high_threshold_percent=101)
        assert await ev.dry_run(["memory.available<4Gi"]) == RESULT
        with pytest.raises(InvalidRequest, match="unsupported eviction signal"):
            await ev.dry_run(["bad<1"])
        assert backend.asked == [None, 0, 101, ["memory.available<4Gi"], ["bad<1"]]
    finally:
        await gc.close()
        await ev.close()
        for s in servers:
            s.cancel()
        await asyncio.gather(*servers, return_exceptions=True)


def test_gc_table() -> None:
    text = gc_text(PLAN)
    lines = text.splitlines()
    assert lines[0] == (
        "image filesystem /var/lib/containerd: 70% used of 100.0Mi, 30.0Mi available "
        "(high threshold 50%, low 40%): must free 30.0Mi to reach the low threshold"
    )
    assert lines[1].split() == ["KIND", "ID", "NAME", "POD", "BYTES", "REASON"]
    assert lines[2].split()[:5] == ["container", "c" * 13, "main", "ns/web", "4.0Ki"]
    assert lines[3].split()[4] == "?"
    assert lines[5].split()[:2] == ["image", "a" * 13]
    assert lines[-1] == "4 removals, 12.0Mi freed (1 of unknown size)"
    nothing = CollectionPlan(True, 85, 80, 1 << 30, 1 << 29, 50, "/x", 0, (), "")
    assert gc_text(nothing).endswith("nothing would be removed")
    assert "until they have" in gc_text(CollectionPlan(False, 85, 80))


def test_evict_table() -> None:
    lines = evict_text(RESULT).splitlines()
    assert lines[0].split() == [
        "SIGNAL",
        "AVAILABLE",
        "CAPACITY",
        "THRESHOLD",
        "VALUE",
        "CROSSED",
        "MET",
    ]
    assert lines[1].split() == [
        "memory.available",
        "3.0Gi",
        "8.0Gi",
        "memory.available<4Gi",
        "(hard)",
        "4.0Gi",
        "yes",
        "yes",
    ]
    assert lines[2].split() == ["pid.available", "4000000", "4194304", "-", "-", "no", "no"]
    assert "conditions: MemoryPressure" in lines
    assert RESULT.summary in lines
    assert lines[-3].split()[:4] == ["1", "kube-system/etcd", "critical", "memory"]
    assert lines[-2].split()[:4] == ["2", "ns/hog", "yes", "1s"]
    assert lines[-1] == "message: The node was low on resource: memory."


def test_json_keeps_exact_numbers() -> None:
    doc = json.loads(as_json(PLAN, service="image-gc", socket="/s"))
    assert doc["service"] == "image-gc" and doc["removals"][1]["bytes"] is None
    assert doc["removals"][3]["bytes"] == 12 << 20
    doc = json.loads(as_json(RESULT))
    assert doc["pods"][1]["evict"] is True and doc["signals"][0]["available"] == 3 << 30


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (1023, "1023"), (1536, "1.5Ki"), (5 << 30, "5.0Gi"), (-2048, "-2.0Ki")],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_counted_signals_print_as_numbers() -> None:
    assert signal_amount("nodefs.inodesFree", 2048) == "2048"
    assert signal_amount("nodefs.available", 2048) == "2.0Ki"


def test_not_running_names_the_service_and_every_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KLET_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    node = tmp_path / "run-klet"
    monkeypatch.setattr(dryrun, "DEFAULT_RUN_DIRS", (node, Path(".run")))
    assert main(["gc", "--dry-run"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"klet gc: image-gc is not running here: no socket at "
        f"{node}/grpc/image-gc/image-gc.sock, .run/grpc/image-gc/image-gc.sock"
    )
    monkeypatch.setenv("KLET_RUN_DIR", str(tmp_path / "env"))
    assert main(["evict", "--dry-run"]) == 1
    assert (
        f"eviction is not running here: no socket at {tmp_path}/env/grpc/eviction/eviction.sock"
        in capsys.readouterr().err
    )
    assert main(["evict", "--dry-run", "--run-dir", str(tmp_path / "flag")]) == 1
    assert f"{tmp_path}/flag/grpc/eviction/eviction.sock" in capsys.readouterr().err


def test_a_socket_nobody_answers_on_is_not_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = grpc_socket(tmp_path, IMAGE_GC)
    path.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nothing listens
    assert main(["gc", "--dry-run", "--run-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"klet gc: image-gc is not answering at {path}: UNAVAILABLE" in err


def test_a_failing_service_is_named_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = grpc_socket(tmp_path, EVICTION)
    path.parent.mkdir(parents=True)
    path.touch()

    async def fails(self: object, thresholds: Sequence[str] = ()) -> DryRunResult:
        raise dryrun.RpcUnavailable("INTERNAL: DryRun: bus unavailable")

    monkeypatch.setattr(EvictionClient, "dry_run", fails)
    assert main(["evict", "--dry-run", "--run-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"klet evict: eviction failed to answer at {path}: INTERNAL: DryRun: bus unavailable"
    )


def test_malformed_signal_and_missing_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evict", "--dry-run", "--run-dir", str(tmp_path), "--signal", "memory"]) == 2
    assert 'klet evict: --signal: malformed pair "memory"' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        dryrun.gc([])
    assert exit_.value.code == 2
    assert "--dry-run" in capsys.readouterr().err


HOSTILE = "\x1b]0;owned\x07\x1b[2J"
"""The reproduced attack: retitle the terminal, then clear it."""


def test_names_and_messages_from_pods_show_control_characters_escaped() -> None:
    removal = PlannedRemoval("image", "sha256:" + "a" * 64, f"r/a{HOSTILE}:1", "", "space", 1)
    gc = gc_text(dataclasses.replace(PLAN, removals=(removal,), problem=f"x{HOSTILE}"))
    hog = dataclasses.replace(RESULT.pods[1], pod=f"ns/hog{HOSTILE}", message=f"m{HOSTILE}")
    evict = evict_text(dataclasses.replace(RESULT, pods=(hog,), summary=f"s{HOSTILE}"))
    for text in (gc, evict):
        assert [ch for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")] == []
    assert "r/a\\x1b]0;owned\\x07\\x1b[2J" in gc
    assert "image GC: x\\x1b]0;owned" in gc
    assert "message: m\\x1b]0;owned\\x07\\x1b[2J" in evict.splitlines()
    assert "ns/hog\\x1b]0;owned" in evict and "s\\x1b]0;owned" in evict
    # the escaped cell sets its column's width: the next column still lines up
    header, row = gc.splitlines()[2:4]
    assert header.index("REASON") == row.index("space")

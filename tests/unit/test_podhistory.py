"""klet.model.podhistory: what a status and an Event add to a pod's history, and the
answer `klet why` draws from it (pure, table-driven); its text shows terminal escapes,
C1 controls and bidi overrides from a pod's messages escaped, never raw."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import pytest
from klet.model import podhistory
from klet.model.podhistory import EVICTION_NOTE, HISTORY_ONLY, explain, observe
from klet.model.records import EventRecord, HistoryEntry, HistoryIndexRecord, PodStatusRecord
from klet.model.timestamps import rfc3339

T0 = 1_800_000_000.0


def status(*containers: dict[str, Any], phase: str = "Running", **extra: Any) -> PodStatusRecord:
    body: dict[str, Any] = {"phase": phase, "containerStatuses": list(containers), **extra}
    return PodStatusRecord(
        uid="u1", namespace="ns", name="web", version=1, epoch=0.0, status=body, updated_at=T0
    )


def running(
    name: str = "app", *, at: float = T0, restarts: int = 0, ready: bool = True, last: Any = None
) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": name,
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": rfc3339(at)}},
    }
    if last is not None:
        cs["lastState"] = {"terminated": last}
    return cs


def terminated(code: int, at: float, reason: str = "Error") -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": reason,
        "finishedAt": rfc3339(at),
        "containerID": "containerd://c1",
    }


def whats(entries: list[HistoryEntry]) -> list[tuple[str, str, str]]:
    return [(e.what, e.reason, e.container) for e in entries]


def test_a_first_status_records_the_start_readiness_and_phase() -> None:
    entries, index = observe(None, status(running()), now=T0 + 1)
    assert whats(entries) == [
        ("started", "Running", "app"),
        ("ready", "Ready", "app"),
        ("phase", "Running", ""),
    ]
    assert entries[0].at == T0  # the container's own start time
    assert (index.namespace, index.name, index.phase) == ("ns", "web", "Running")
    assert index.containers["app"]["started"] == T0


def test_the_same_status_again_records_nothing() -> None:
    _, index = observe(None, status(running()), now=T0 + 1)
    again, after = observe(index, status(running()), now=T0 + 5)
    assert again == []
    assert after.containers == index.containers and after.first_at == index.first_at


def test_a_restart_records_the_exit_with_its_signal_then_the_new_start() -> None:
    _, index = observe(None, status(running()), now=T0 + 1)
    after = status(running(at=T0 + 30, restarts=1, last=terminated(137, T0 + 29)))
    entries, index = observe(index, after, now=T0 + 31)
    assert whats(entries) == [("exited", "Error", "app"), ("started", "Running", "app")]
    exited = entries[0]
    assert exited.at == T0 + 29 and exited.type == "Warning"
    assert exited.message == "exited with code 137 (SIGKILL): Error"
    assert exited.detail == {
        "exitCode": 137,
        "restartCount": 1,
        "signal": "SIGKILL",
        "containerID": "containerd://c1",
    }
    assert entries[1].message == "running (restart 1)"
    # The exit stays in lastState: seen again, it is not recorded twice.
    assert observe(index, after, now=T0 + 40)[0] == []


def test_waiting_for_a_reason_is_recorded_once_per_reason() -> None:
    pulling = {
        "name": "app",
        "restartCount": 0,
        "state": {"waiting": {"reason": "ContainerCreating"}},
    }
    failing = {
        "name": "app",
        "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
    }
    first, index = observe(None, status(pulling, phase="Pending"), now=T0)
    assert [(e.what, e.reason, e.type) for e in first] == [
        ("waiting", "ContainerCreating", "Normal"),
        ("phase", "Pending", "Normal"),
    ]
    second, index = observe(index, status(failing, phase="Pending"), now=T0 + 5)
    assert [(e.reason, e.type, e.message) for e in second] == [
        ("ImagePullBackOff", "Warning", "Back-off pulling image")
    ]
    assert observe(index, status(failing, phase="Pending"), now=T0 + 9)[0] == []


def test_a_failed_phase_keeps_its_reason_and_message() -> None:
    _, index = observe(None, status(running()), now=T0)
    gone = status(
        {"name": "app", "restartCount": 0, "state": {"terminated": terminated(137, T0 + 9)}},
        phase="Failed",
        reason="Evicted",
        message="The node was low on resource: memory. ",
    )
    entries, index = observe(index, gone, now=T0 + 10)
    assert whats(entries) == [("exited", "Error", "app"), ("phase", "Evicted", "")]
    assert entries[1].type == "Warning" and entries[1].detail == {"phase": "Failed"}
    assert index.phase == "Failed"


def event(
    reason: str, message: str, *, at: float, container: str = "app", **extra: Any
) -> EventRecord:
    involved: dict[str, Any] = {"kind": "Pod", "namespace": "ns", "name": "web", "uid": "u1"}
    if container:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    return EventRecord(
        type="Warning" if reason in ("Unhealthy", "Evicted", EVICTION_NOTE) else "Normal",
        reason=reason,
        message=message,
        involved=involved,
        component="kubelet",
        at=at,
        extra=extra,
    )


def entry(record: EventRecord, source: str = "syncloop") -> HistoryEntry:
    found = podhistory.from_event(record, source=source)
    assert found is not None and found[0] == "u1"
    return found[1]


def test_an_event_about_a_pod_is_an_entry_with_its_container_and_detail() -> None:
    item = entry(event("Killing", "Container app failed liveness probe, will be restarted", at=T0))
    assert (item.what, item.source, item.container, item.at) == ("event", "syncloop", "app", T0)
    note = entry(
        event(
            EVICTION_NOTE,
            "m",
            at=T0,
            container="",
            **{HISTORY_ONLY: True, "detail": {"signal": "memory.available"}},
        ),
        source="eviction",
    )
    assert note.detail == {"signal": "memory.available"} and note.container == ""
    assert podhistory.history_only(event(EVICTION_NOTE, "m", at=T0, **{HISTORY_ONLY: True}))
    node_event = EventRecord(
        type="Normal",
        reason="Starting",
        message="",
        involved={"kind": "Node", "name": "n", "uid": "n"},
        component="kubelet",
        at=T0,
    )
    assert podhistory.from_event(node_event, source="syncloop") is None


def history(
    *items: HistoryEntry | EventRecord, restarts: int = 0, phase: str = "Running"
) -> tuple[HistoryIndexRecord, list[HistoryEntry]]:
    entries = [i if isinstance(i, HistoryEntry) else entry(i) for i in items]
    index = HistoryIndexRecord(
        namespace="ns", name="web", first_at=T0, last_at=T0 + 100, phase=phase,
        containers={"app": {"restarts": restarts}},
    )  # fmt: skip
    return index, entries


def exit_entry(code: int, at: float, reason: str = "Error") -> HistoryEntry:
    items, _ = observe(
        HistoryIndexRecord(
            namespace="ns",
            name="web",
            first_at=T0,
            last_at=T0,
            phase="Running",
            containers={"app": {"finished": 0.0}},
        ),
        status(running(at=at + 1, restarts=1, last=terminated(code, at, reason))),
        now=at + 2,
    )
    return items[0]


@pytest.mark.parametrize(
    ("items", "restarts", "phase", "answer"),
    [
        pytest.param(
            [
                event(
                    "Unhealthy", "Liveness probe failed: cat: /tmp/alive: No such file\n", at=T0 + 1
                ),
                event(
                    "Killing", "Container app failed liveness probe, will be restarted", at=T0 + 2
                ),
                exit_entry(137, T0 + 4),
            ],
            1,
            "Running",
            "restarted 1 time: liveness probe failed (Liveness probe failed: cat: /tmp/alive: "
            "No such file); container app then exited with code 137 (SIGKILL): Error",
            id="liveness",
        ),
        pytest.param(
            [
                event("Unhealthy", "Startup probe failed: not yet", at=T0 + 1),
                event(
                    "Killing", "Container app failed startup probe, will be restarted", at=T0 + 2
                ),
                exit_entry(137, T0 + 3),
            ],
            3,
            "Running",
            "restarted 3 times: startup probe failed (Startup probe failed: not yet); "
            "container app then exited with code 137 (SIGKILL): Error",
            id="startup",
        ),
        pytest.param(
            [exit_entry(137, T0 + 3, "OOMKilled")],
            2,
            "Running",
            "restarted 2 times: container app was OOM-killed (exit code 137)",
            id="oom",
        ),
        pytest.param(
            [exit_entry(1, T0 + 3)],
            1,
            "Running",
            "restarted 1 time: container app exited with code 1: Error",
            id="crash",
        ),
        pytest.param(
            [
                event(
                    EVICTION_NOTE,
                    "memory.available: ...",
                    at=T0 + 1,
                    container="",
                    **{
                        HISTORY_ONLY: True,
                        "detail": {
                            "signal": "memory.available",
                            "threshold": "memory.available<100Mi (hard)",
                            "available": "50Mi",
                            "rank": "over its request by 1Gi, priority 0",
                        },
                    },
                ),
                event(
                    "Evicted",
                    "The node was low on resource: memory. "
                    "Threshold quantity: 100Mi, available: 50Mi. ",
                    at=T0 + 1,
                    container="",
                ),
            ],
            0,
            "Failed",
            "evicted under memory pressure: signal memory.available (memory.available<100Mi "
            "(hard) met, 50Mi available); chosen because over its request by 1Gi, priority 0. "
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.",
            id="evicted-with-the-note",
        ),
        pytest.param(
            [event("Evicted", "The node was low on resource: pids. ", at=T0 + 1, container="")],
            0,
            "Failed",
            "evicted under pids pressure (signal pid.available): "
            "The node was low on resource: pids.",
            id="evicted-without-a-note",
        ),
        pytest.param(
            [
                HistoryEntry(
                    at=T0,
                    source="status",
                    what="waiting",
                    type="Warning",
                    reason="ImagePullBackOff",
                    message='Back-off pulling image "x"',
                    container="app",
                ),
            ],
            0,
            "Pending",
            'container app not running: ImagePullBackOff: Back-off pulling image "x"',
            id="image-pull",
        ),
        pytest.param(
            [
                HistoryEntry(
                    at=T0,
                    source="status",
                    what="waiting",
                    type="Warning",
                    reason="CrashLoopBackOff",
                    message="back-off",
                    container="app",
                ),
                HistoryEntry(
                    at=T0 + 5,
                    source="status",
                    what="started",
                    type="Normal",
                    reason="Running",
                    message="running",
                    container="app",
                ),
            ],
            0,
            "Running",
            "Running, never restarted",
            id="waited-then-started",
        ),
        pytest.param(
            [
                HistoryEntry(
                    at=T0,
                    source="status",
                    what="phase",
                    type="Warning",
                    reason="OutOfcpu",
                    message="Node didn't have enough resource: cpu",
                    detail={"phase": "Failed"},
                )
            ],
            0,
            "Failed",
            "failed: OutOfcpu: Node didn't have enough resource: cpu",
            id="rejected-at-admission",
        ),
        pytest.param(
            [event("Killing", "Stopping container app", at=T0)],
            0,
            "Running",
            "stopped: Stopping container app",
            id="deleted",
        ),
    ],
)
def test_the_answer_comes_first(items: list[Any], restarts: int, phase: str, answer: str) -> None:
    index, entries = history(*items, restarts=restarts, phase=phase)
    assert explain(index, "u1", entries).answer == answer


def test_text_and_json_show_every_entry_in_time_order_on_one_line_each() -> None:
    index, entries = history(
        event("Killing", "Container app failed liveness probe, will be restarted", at=T0 + 2),
        event("Unhealthy", "Liveness probe failed: two\nlines", at=T0 + 1),
        restarts=1,
    )
    story = explain(index, "u1", entries)
    lines = podhistory.render_text(story).splitlines()
    assert lines[0].startswith("ns/web (uid u1): restarted 1 time: liveness probe failed (")
    assert lines[2].split() == ["TIME", "SOURCE", "CONTAINER", "TYPE", "WHAT"]
    assert lines[3].endswith("Unhealthy: Liveness probe failed: two lines")
    assert lines[4].endswith("Killing: Container app failed liveness probe, will be restarted")
    body = podhistory.to_json(story)
    assert [e["reason"] for e in body["timeline"]] == ["Unhealthy", "Killing"]
    assert body["timeline"][0] == {
        "time": rfc3339(T0 + 1), "at": T0 + 1, "source": "syncloop", "what": "event",
        "type": "Warning", "reason": "Unhealthy", "message": "Liveness probe failed: two\nlines",
        "container": "app",
    }  # fmt: skip
    assert (body["restarts"], body["namespace"], body["name"], body["uid"]) == (
        1,
        "ns",
        "web",
        "u1",
    )


def test_control_characters_from_a_pod_reach_the_text_escaped_never_raw() -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J"
    index, entries = history(
        event("Killing", f"Stopping container{hostile}", at=T0 + 1, container="app\x9b31m"),
        event("Unhealthy", "Liveness probe failed: \u202egnp.exe", at=T0 + 2),
        restarts=1,
    )
    index = HistoryIndexRecord(
        namespace="ns\x1b[8m", name="web", first_at=T0, last_at=T0, phase="Running",
        containers={"app": {"restarts": 1}},
    )  # fmt: skip
    text = podhistory.render_text(explain(index, "u1", entries))
    assert [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")] == []
    assert "Stopping container\\x1b]0;owned\\x07\\x1b[2J" in text
    assert "app\\x9b31m" in text and "\\u202egnp.exe" in text
    assert text.startswith("ns\\x1b[8m/web (uid u1): ")
    # JSON keeps the text as it is: its own escaping makes it safe to print.
    body = podhistory.to_json(explain(index, "u1", entries))
    assert body["timeline"][0]["message"] == f"Stopping container{hostile}"
    assert "\x1b" not in json.dumps(body)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, ünïcode, 日本", "plain text, ünïcode, 日本"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("bell\x07 del\x7f", "bell\\x07 del\\x7f"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
    ],
)
def test_printable(raw: str, shown: str) -> None:
    assert podhistory.printable(raw) == shown

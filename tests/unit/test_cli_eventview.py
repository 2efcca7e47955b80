"""`klet events`' pure half (klet.cli.eventview): records folded into Events by involved
object, type, reason, message and component within the 10-minute window (count, first
and last seen; a node Event in "default"), kubectl's human ages, the LAST SEEN cell with
"(xN over AGE)", the default and wide columns with and without NAMESPACE, one-line
messages, aligned rendering, the namespace filter and the Event JSON; every cell shows
control and format characters escaped (a terminal escape in a message never reaches
the terminal raw)."""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from typing import Any

import pytest
from klet.cli.eventview import (
    Correlator,
    aggregate,
    cells,
    event_list,
    header,
    human_duration,
    in_namespace,
    last_seen_cell,
    render_table,
    row_of,
    to_event,
)
from klet.model.records import EventRecord

T0 = 1_700_000_000.0


def pod(name: str = "web-node1", ns: str = "default", uid: str = "u1", **more: str) -> Any:
    return {"kind": "Pod", "namespace": ns, "name": name, "uid": uid, **more}


def rec(
    at: float,
    reason: str = "BackOff",
    message: str = "Back-off pulling image",
    *,
    type_: str = "Normal",
    involved: Any = None,
    component: str = "kubelet",
    count: int = 1,
) -> EventRecord:
    return EventRecord(
        type=type_,
        reason=reason,
        message=message,
        involved=pod() if involved is None else involved,
        component=component,
        at=at,
        count=count,
    )


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        pytest.param([], [], id="nothing"),
        pytest.param(
            [rec(T0), rec(T0 + 10), rec(T0 + 40)],
            [("BackOff", 3, T0, T0 + 40)],
            id="same event thrice is one row",
        ),
        pytest.param(
            [rec(T0 + 40), rec(T0), rec(T0 + 10)],
            [("BackOff", 3, T0, T0 + 40)],
            id="order of arrival does not matter",
        ),
        pytest.param(
            [rec(T0, "Pulling", "a"), rec(T0 + 1, "Failed", "b"), rec(T0 + 2, "Pulling", "a")],
            [("Failed", 1, T0 + 1, T0 + 1), ("Pulling", 2, T0, T0 + 2)],
            id="sorted by last seen",
        ),
        pytest.param(
            [rec(T0, message="x"), rec(T0 + 1, message="y")],
            [("BackOff", 1, T0, T0), ("BackOff", 1, T0 + 1, T0 + 1)],
            id="another message is another event",
        ),
        pytest.param(
            [rec(T0), rec(T0 + 1, type_="Warning")],
            [("BackOff", 1, T0, T0), ("BackOff", 1, T0 + 1, T0 + 1)],
            id="another type is another event",
        ),
        pytest.param(
            [rec(T0), rec(T0 + 1, involved=pod(uid="u2"))],
            [("BackOff", 1, T0, T0), ("BackOff", 1, T0 + 1, T0 + 1)],
            id="another uid (a recreated pod) is another event",
        ),
        pytest.param(
            [rec(T0), rec(T0 + 1, involved=pod(fieldPath="spec.containers{a}"))],
            [("BackOff", 1, T0, T0), ("BackOff", 1, T0 + 1, T0 + 1)],
            id="another container is another event",
        ),
        pytest.param(
            [rec(T0), rec(T0 + 1, component="other")],
            [("BackOff", 1, T0, T0), ("BackOff", 1, T0 + 1, T0 + 1)],
            id="another component is another event",
        ),
        pytest.param(
            [rec(T0), rec(T0 + 599), rec(T0 + 599 + 600), rec(T0 + 599 + 601)],
            [("BackOff", 2, T0, T0 + 599), ("BackOff", 2, T0 + 1199, T0 + 1200)],
            id="a gap of the window starts a new event",
        ),
        pytest.param(
            [rec(T0, count=3), rec(T0 + 1, count=2)],
            [("BackOff", 5, T0, T0 + 1)],
            id="record counts add up",
        ),
        pytest.param(
            [rec(T0, count=0)],
            [("BackOff", 1, T0, T0)],
            id="a count below one is one",
        ),
    ],
)
def test_aggregate(
    records: list[EventRecord], expected: list[tuple[str, int, float, float]]
) -> None:
    rows = aggregate(records)
    assert [(r.reason, r.count, r.first_seen, r.last_seen) for r in rows] == expected


def test_correlator_returns_the_row_it_made_or_grew() -> None:
    c = Correlator()
    first = c.add(rec(T0))
    grown = c.add(rec(T0 + 5))
    other = c.add(rec(T0 + 6, "Failed"))
    assert (first.count, grown.count, other.count) == (1, 2, 1)
    assert grown.event_name == first.event_name  # the same Event, patched
    assert other.event_name != first.event_name
    assert [r.reason for r in c.rows()] == ["BackOff", "Failed"]


def test_row_of_a_node_event_and_a_sparse_reference() -> None:
    node = row_of(rec(T0, "NodeReady", involved={"kind": "Node", "name": "n1", "uid": "n1"}))
    assert (node.namespace, node.kind, node.name, node.field_path) == ("default", "Node", "n1", "")
    sparse = row_of(EventRecord(type="", reason="R", message="m", involved={}, component="", at=T0))
    assert (sparse.namespace, sparse.type, sparse.component, sparse.name) == (
        "default",
        "Normal",
        "kubelet",
        "",
    )
    assert sparse.event_name.startswith("unknown.")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-0.5, "0s"),
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (192, "3m12s"),
        (599, "9m59s"),
        (600, "10m"),
        (179 * 60 + 59, "179m"),
        (3 * 3600, "3h"),
        (4 * 3600 + 5 * 60, "4h5m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (48 * 3600, "2d"),
        (3 * 86400 + 5 * 3600, "3d5h"),
        (8 * 86400, "8d"),
        (729 * 86400, "729d"),
        (730 * 86400, "2y"),
        (3 * 365 * 86400 + 10 * 86400, "3y10d"),
        (9 * 365 * 86400 + 10 * 86400, "9y"),
    ],
)
def test_human_duration(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_last_seen_cell_names_count_and_first_age_when_repeated() -> None:
    once = aggregate([rec(T0)])[0]
    assert last_seen_cell(once, now=T0 + 30) == "30s"
    rows = aggregate([rec(T0), rec(T0 + 60), rec(T0 + 240)])
    assert last_seen_cell(rows[0], now=T0 + 300) == "60s (x3 over 5m)"


@pytest.mark.parametrize(
    ("namespaced", "wide", "head", "line"),
    [
        (
            False,
            False,
            ["NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            ["kube-system", "5s (x2 over 15s)", "Warning", "Failed", "pod/dns-n1", "Error: x y"],
        ),
        (
            True,
            False,
            ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            ["5s (x2 over 15s)", "Warning", "Failed", "pod/dns-n1", "Error: x y"],
        ),
        (
            True,
            True,
            [
                "LAST SEEN",
                "TYPE",
                "REASON",
                "OBJECT",
                "SUBOBJECT",
                "SOURCE",
                "MESSAGE",
                "FIRST SEEN",
                "COUNT",
                "NAME",
            ],
            [
                "5s (x2 over 15s)",
                "Warning",
                "Failed",
                "pod/dns-n1",
                "spec.containers{dns}",
                "kubelet, n1",
                "Error: x y",
                "15s",
                "2",
                f"dns-n1.{int(T0 * 1e9):x}",
            ],
        ),
    ],
)
def test_columns(namespaced: bool, wide: bool, head: list[str], line: list[str]) -> None:
    involved = pod("dns-n1", "kube-system", fieldPath="spec.containers{dns}")
    records = [
        rec(T0, "Failed", "Error: x\n y", type_="Warning", involved=involved),
        rec(T0 + 10, "Failed", "Error: x\n y", type_="Warning", involved=involved),
    ]
    (row,) = aggregate(records)
    assert header(namespaced=namespaced, wide=wide) == head
    assert cells(row, now=T0 + 15, namespaced=namespaced, wide=wide, node="n1") == line
    assert len(head) == len(line)


def test_render_table_aligns_columns_and_does_not_pad_the_last() -> None:
    text = render_table([["A", "LONG HEADER", "MSG"], ["xxxx", "b", "m  "], ["y", "c", "n"]])
    assert text.splitlines() == [
        "A      LONG HEADER   MSG",
        "xxxx   b             m",
        "y      c             n",
    ]


def test_namespace_filter() -> None:
    row = aggregate([rec(T0, involved=pod(ns="kube-system"))])[0]
    assert in_namespace(row, None) and in_namespace(row, "kube-system")
    assert not in_namespace(row, "default")


def test_event_json_is_a_core_v1_event() -> None:
    rows = aggregate([rec(T0, involved=pod(fieldPath="spec.containers{a}")), rec(T0 + 61)])
    event = to_event(rows[1], node="n1")
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"web-node1.{int((T0 + 61) * 1e9):x}", "namespace": "default"},
        "involvedObject": {
            "kind": "Pod",
            "name": "web-node1",
            "apiVersion": "v1",
            "namespace": "default",
            "uid": "u1",
        },
        "reason": "BackOff",
        "message": "Back-off pulling image",
        "type": "Normal",
        "source": {"component": "kubelet", "host": "n1"},
        "firstTimestamp": "2023-11-14T22:14:21Z",
        "lastTimestamp": "2023-11-14T22:14:21Z",
        "count": 1,
        "reportingComponent": "kubelet",
        "reportingInstance": "n1",
    }
    assert to_event(rows[0], node="n1")["involvedObject"]["fieldPath"] == "spec.containers{a}"
    node_event = to_event(
        aggregate([rec(T0, involved={"kind": "Node", "name": "n1", "uid": "n1"})])[0], node="n1"
    )
    assert "namespace" not in node_event["involvedObject"]
    assert node_event["metadata"]["namespace"] == "default"
    listed = event_list(rows, node="n1")
    assert (listed["kind"], len(listed["items"])) == ("List", 2)


HOSTILE = "\x1b]0;owned\x07\x1b[2J"
"""The reproduced attack: retitle the terminal, then clear it."""


@pytest.mark.parametrize("wide", [False, True])
def test_every_cell_shows_control_characters_escaped(wide: bool) -> None:
    involved = pod(f"web{HOSTILE}", f"ns\u202e{HOSTILE}", fieldPath=f"spec{HOSTILE}")
    record = rec(T0, f"Bad{HOSTILE}", f"exit: {HOSTILE}\x9b31m", involved=involved)
    (row,) = aggregate([replace(record, type=f"Warning{HOSTILE}", component=f"k{HOSTILE}")])
    line = cells(row, now=T0 + 5, namespaced=False, wide=wide, node="n1")
    text = render_table([header(namespaced=False, wide=wide), line])
    assert not [ch for ch in text if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf")]
    assert "\\x1b]0;owned\\x07\\x1b[2J" in line[-1 if not wide else 6]
    assert line[0] == "ns\\u202e\\x1b]0;owned\\x07\\x1b[2J"
    assert "\\x9b31m" in text  # a C1 control (CSI) too
    # JSON escapes them itself, and keeps the text as it was.
    assert to_event(row, node="n1")["message"] == f"exit: {HOSTILE}\x9b31m"

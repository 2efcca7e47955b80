"""Bus records: round trip, and strict decoding that rejects (never half-reads) a
payload of an unknown version, with missing or unknown fields, or wrong types; the
sources-ready gate over the `sources` table."""

from __future__ import annotations

import json

import pytest
from klet.model.records import (
    BadRecord,
    DesiredPod,
    PodChange,
    PodStatusRecord,
    SourceState,
    sources_ready,
)
from klet.model.types import PodUID


def test_round_trip() -> None:
    rec = PodStatusRecord(
        uid=PodUID("u"),
        namespace="default",
        name="p",
        version=3,
        epoch=1.5,
        status={"phase": "Running"},
        updated_at=2.0,
        terminated=True,
    )
    assert PodStatusRecord.decode(rec.encode()) == rec
    assert json.loads(rec.encode())["v"] == 1


def test_optional_field_defaults() -> None:
    raw = {
        "v": 1,
        "uid": "u",
        "namespace": "n",
        "name": "p",
        "version": 1,
        "epoch": 0.0,
        "status": {},
        "updated_at": 0.0,
    }
    assert PodStatusRecord.decode(json.dumps(raw)).terminated is False


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"v": 2, "op": "ADD", "uid": "u", "source": "file"}', "unsupported version 2"),
        ('{"op": "ADD", "uid": "u", "source": "file"}', "unsupported version None"),
        ('{"v": 1, "op": "ADD", "source": "file"}', r"missing field\(s\) uid"),
        ('{"v": 1, "op": "ADD", "uid": "u", "source": "file", "x": 1}', r"unknown field\(s\) x"),
        ('{"v": 1, "op": "EXPLODE", "uid": "u", "source": "file"}', "not one of"),
        ('{"v": 1, "op": "ADD", "uid": "u", "source": "ftp"}', "not one of"),
        ('{"v": 1, "op": "ADD", "uid": 7, "source": "file"}', "has type int"),
    ],
)
def test_bad_payloads_are_rejected(raw: str, message: str) -> None:
    with pytest.raises(BadRecord, match=message):
        PodChange.decode(raw)


def test_bool_is_not_an_int() -> None:
    raw = {"v": 1, "uid": "u", "pod": {}, "source": "file", "hash": "h", "seen_at": True}
    with pytest.raises(BadRecord, match="seen_at"):
        DesiredPod.decode(json.dumps(raw))


def _table(**ready: bool) -> dict[str, SourceState]:
    return {name: SourceState(source=name, ready=r, at=1.0) for name, r in ready.items()}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("table", "ready"),
    [
        pytest.param({}, False, id="empty table (flushed Redis): never ready"),
        pytest.param(_table(api=False), False, id="configured, no snapshot yet"),
        pytest.param(_table(api=True), True, id="the one source ready"),
        pytest.param(_table(api=True, file=False), False, id="one source still loading"),
        pytest.param(_table(api=True, file=True, http=True), True, id="every source ready"),
    ],
)
def test_sources_ready(table: dict[str, SourceState], ready: bool) -> None:
    assert sources_ready(table) is ready

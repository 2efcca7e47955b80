"""Reading a pod's history from the bus: the lookup `klet why` and the kubelet API's
`/why/<namespace>/<name>` share (status-reporter writes the histories, see its
`history.py`; klet.model.podhistory draws the answer)."""

from __future__ import annotations

from dataclasses import dataclass

from klet.bus.schema import NodeBus
from klet.model import podhistory
from klet.model.podhistory import Story
from klet.model.records import HistoryIndexRecord
from klet.model.timestamps import rfc3339
from klet.model.types import JSON


@dataclass(frozen=True)
class Found:
    """The story of the newest pod of that name, and the UIDs of earlier ones."""

    story: Story
    earlier: tuple[tuple[str, HistoryIndexRecord], ...]
    skipped: int
    """History entries that did not decode (left out, counted)."""


async def pod_story(
    bus: NodeBus, namespace: str, name: str, *, max_entries: int = 10_000
) -> Found | None:
    """The history of pod `namespace`/`name` (or of the pod whose UID is `name`), None
    when none is kept. Raises BusError."""
    index = await bus.history.all()
    matches = sorted(
        (
            (uid, row)
            for uid, row in index.items()
            if (row.namespace == namespace and row.name == name) or uid == name
        ),
        key=lambda item: item[1].last_at,
        reverse=True,
    )
    if not matches:
        return None
    uid, row = matches[0]
    entries = await bus.history_of(uid).latest(max_entries)
    decoded = [e.record for e in entries if e.record is not None]
    return Found(
        story=podhistory.explain(row, uid, decoded),
        earlier=tuple(matches[1:]),
        skipped=len(entries) - len(decoded),
    )


def found_json(found: Found) -> JSON:
    """`klet why -o json` and the kubelet API's /why: the story, and earlier pods of
    the same name."""
    body = podhistory.to_json(found.story)
    body["earlier"] = [{"uid": uid, "lastAt": rfc3339(row.last_at)} for uid, row in found.earlier]
    body["undecodable"] = found.skipped
    return body


async def story_json(bus: NodeBus, namespace: str, name: str) -> JSON | None:
    """`found_json` of `pod_story`, None when no history is kept."""
    found = await pod_story(bus, namespace, name)
    return None if found is None else found_json(found)

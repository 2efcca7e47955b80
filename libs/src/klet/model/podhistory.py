"""A pod's history for `klet why`: what goes into it, and the answer drawn from it.

status-reporter's leader keeps, per pod, a bounded stream of `HistoryEntry` on the bus
(`history:<uid>`). Two things feed it, both pure functions here:

- `from_event`: every Event any service records about the pod (admission, Pulling and
  Pulled with the image's size and time, Created, Started, Unhealthy with the probe's
  output, Killing with who and why, BackOff, Evicted with the signal's numbers,
  FailedMount, ...), kept one by one: no aggregation, no one-hour expiry;
- `observe`: each new status syncloop computes, compared with what was recorded last
  (`HistoryIndexRecord.containers`): a container started (at its own start time), exited
  (code, signal, reason such as OOMKilled, at its finish time), waiting for a reason,
  became ready or not; the pod's phase changed. Only changes become entries, so
  recording the same status twice, or after a restart, adds nothing.

`explain` reads a history and answers first ("restarted 3 times: liveness probe failed
(...)"), then `render_text` or `to_json` show the timeline. Most of what a history says
comes from pods (termination messages, probe output, image names) and so from whoever
wrote the pod: `render_text` shows every control and format character (a terminal
escape such as `\x1b]0;title\x07`, a bidi override) as its escape sequence, never raw,
so a history cannot drive or rewrite the operator's terminal; `to_json` leaves the text
as it is and JSON's own escaping carries it. Everything here takes its
inputs as arguments: the manager (status-reporter) and the readers (`klet why`, the
kubelet API) do the I/O.
"""

from __future__ import annotations

import re
import signal
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from klet.model.records import EventRecord, HistoryEntry, HistoryIndexRecord, PodStatusRecord
from klet.model.timestamps import rfc3339
from klet.model.types import JSON

STATUS = "status"
"""The `source` of entries drawn from pod statuses."""

HISTORY_ONLY = "historyOnly"
"""`EventRecord.extra` key: a record for the pod's history only, which is neither
posted to the apiserver nor shown by `klet events` (upstream records no such Event):
the eviction service's choice of a pod, with the signal, its threshold and the ranking
in `extra["detail"]`."""


EVICTION_NOTE = "EvictionChosen"
"""The reason of the eviction service's HISTORY_ONLY note."""


def history_only(record: EventRecord) -> bool:
    """Whether `record` is for the pod's history only (HISTORY_ONLY)."""
    return bool(record.extra and record.extra.get(HISTORY_ONLY))


# Waiting reasons that are progress, not trouble.
_QUIET_WAITING = frozenset({"ContainerCreating", "PodInitializing", ""})

# The eviction message names the starved resource (upstream's wording); the signal
# that crossed its threshold follows from it.
_STARVED = re.compile(r"The node was low on resource: ([\w.-]+)\.")
_SIGNAL_OF = {
    "memory": "memory.available",
    "pids": "pid.available",
    "ephemeral-storage": "nodefs.available or imagefs.available",
}
_CONTAINER_PATH = re.compile(r"spec\.(?:initContainers|containers|ephemeralContainers)\{(.+)\}")


def parse_time(text: object) -> float | None:
    """Unix seconds of an API timestamp (RFC 3339), None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def from_event(record: EventRecord, *, source: str) -> tuple[str, HistoryEntry] | None:
    """The pod UID and history entry of an Event about a pod; None for other objects."""
    involved = record.involved
    uid = str(involved.get("uid") or "")
    if involved.get("kind") != "Pod" or not uid:
        return None
    found = _CONTAINER_PATH.fullmatch(str(involved.get("fieldPath") or ""))
    detail: JSON = dict(record.extra.get("detail") or {}) if record.extra else {}
    if record.count > 1:
        detail["count"] = record.count
    return uid, HistoryEntry(
        at=record.at,
        source=source,
        what="event",
        type=record.type or "Normal",
        reason=record.reason,
        message=record.message,
        container=found.group(1) if found else "",
        detail=detail,
    )


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code - 128).name if code > 128 else ""
    except ValueError:
        return ""


def _statuses(status: JSON) -> Iterable[JSON]:
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if isinstance(cs, dict) and cs.get("name"):
                yield cs


def _exit_entry(name: str, term: JSON, restarts: int, at: float) -> HistoryEntry:
    code = int(term.get("exitCode") or 0)
    sig = _signal_name(code)
    reason = str(term.get("reason") or ("Completed" if code == 0 else "Error"))
    message = f"exited with code {code}" + (f" ({sig})" if sig else "") + f": {reason}"
    if term.get("message"):
        message += f": {str(term['message']).strip()[:512]}"
    detail: JSON = {"exitCode": code, "restartCount": restarts}
    if sig:
        detail["signal"] = sig
    if term.get("containerID"):
        detail["containerID"] = term["containerID"]
    return HistoryEntry(
        at=at,
        source=STATUS,
        what="exited",
        type="Normal" if code == 0 else "Warning",
        reason=reason,
        message=message,
        container=name,
        detail=detail,
    )


def _observe_container(cs: JSON, before: JSON, now: float) -> tuple[list[HistoryEntry], JSON]:
    name = str(cs["name"])
    state: JSON = cs.get("state") or {}
    restarts = int(cs.get("restartCount") or 0)
    out: list[HistoryEntry] = []
    finished = float(before.get("finished") or 0.0)
    for term in ((cs.get("lastState") or {}).get("terminated"), state.get("terminated")):
        at = parse_time((term or {}).get("finishedAt"))
        if term and at is not None and at > finished:
            out.append(_exit_entry(name, term, restarts, at))
            finished = at
    running = state.get("running")
    started = float(before.get("started") or 0.0)
    if running:
        at = parse_time(running.get("startedAt"))
        if at is not None and at > started:
            started = at
            again = f" (restart {restarts})" if restarts else ""
            out.append(
                HistoryEntry(
                    at=at,
                    source=STATUS,
                    what="started",
                    type="Normal",
                    reason="Running",
                    message=f"running{again}",
                    container=name,
                    detail={"restartCount": restarts},
                )
            )
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if waiting and reason != before.get("waiting", ""):
        out.append(
            HistoryEntry(
                at=now,
                source=STATUS,
                what="waiting",
                type="Normal" if reason in _QUIET_WAITING else "Warning",
                reason=reason or "Waiting",
                message=str(waiting.get("message") or f"waiting: {reason}"),
                container=name,
            )
        )
    ready = bool(cs.get("ready"))
    if running and ready != bool(before.get("ready", False)):
        out.append(
            HistoryEntry(
                at=now,
                source=STATUS,
                what="ready",
                type="Normal",
                reason="Ready" if ready else "NotReady",
                message="ready" if ready else "not ready",
                container=name,
            )
        )
    facts: JSON = {
        "restarts": restarts,
        "started": started,
        "finished": finished,
        "waiting": reason if waiting else "",
        "ready": ready if running else before.get("ready", False) and not state.get("terminated"),
    }
    return out, facts


def observe(
    index: HistoryIndexRecord | None, record: PodStatusRecord, *, now: float
) -> tuple[list[HistoryEntry], HistoryIndexRecord]:
    """What changed in `record` (a status syncloop computed) since `index` last recorded
    it: the new entries, oldest first, and the index to record with them."""
    status = record.status or {}
    seen: JSON = dict(index.containers) if index is not None else {}
    out: list[HistoryEntry] = []
    for cs in _statuses(status):
        entries, seen[str(cs["name"])] = _observe_container(
            cs, seen.get(str(cs["name"])) or {}, now
        )
        out += entries
    phase = str(status.get("phase") or "")
    if phase and phase != (index.phase if index is not None else ""):
        reason = str(status.get("reason") or phase)
        out.append(
            HistoryEntry(
                at=now,
                source=STATUS,
                what="phase",
                type="Warning" if phase == "Failed" else "Normal",
                reason=reason,
                message=str(status.get("message") or f"phase {phase}"),
                detail={"phase": phase},
            )
        )
    out.sort(key=lambda e: e.at)
    return out, HistoryIndexRecord(
        namespace=record.namespace,
        name=record.name,
        first_at=index.first_at if index is not None else now,
        last_at=now,
        phase=phase or (index.phase if index is not None else ""),
        containers=seen,
    )


# -- the answer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Story:
    """What `klet why` says of one pod: the answer, then everything in time order."""

    namespace: str
    name: str
    uid: str
    answer: str
    restarts: int
    timeline: tuple[HistoryEntry, ...]


def _last(entries: Sequence[HistoryEntry], pred: object) -> HistoryEntry | None:
    for entry in reversed(entries):
        if pred(entry):  # type: ignore[operator]
            return entry
    return None


def _probe_kill(kill: HistoryEntry, before: Sequence[HistoryEntry]) -> str:
    """Why a Killing happened, in words, with the probe's own output when a probe did it."""
    for kind in ("liveness", "startup"):
        if f"failed {kind} probe" in kill.message:
            probe = _last(
                before,
                lambda e, k=kind: (
                    e.reason == "Unhealthy"
                    and e.container == kill.container
                    and e.message.lower().startswith(k)
                ),
            )
            output = f" ({probe.message.strip()})" if probe is not None else ""
            return f"{kind} probe failed{output}"
    return kill.message


def _restart_cause(timeline: Sequence[HistoryEntry]) -> str:
    exit_ = _last(timeline, lambda e: e.what == "exited")
    if exit_ is None:
        kill = _last(timeline, lambda e: e.reason == "Killing")
        if kill is not None:  # its exit is not recorded yet
            return _probe_kill(kill, timeline)
        return "no exit recorded (the history starts after it)"
    earlier = [e for e in timeline if e.at <= exit_.at + 1.0]
    kill = _last(
        earlier,
        lambda e: (
            e.reason == "Killing" and e.container == exit_.container and e.at >= exit_.at - 600
        ),
    )
    code = exit_.detail.get("exitCode")
    if kill is not None:
        return f"{_probe_kill(kill, earlier)}; container {exit_.container} then {exit_.message}"
    if exit_.reason == "OOMKilled":
        return f"container {exit_.container} was OOM-killed (exit code {code})"
    return f"container {exit_.container} {exit_.message}"


def _eviction(entry: HistoryEntry, chosen: HistoryEntry | None) -> str:
    """The eviction named by its signal: from the eviction service's note when there is
    one (the exact signal, threshold and ranking), else from upstream's message (the
    starved resource, whose usual signal is named)."""
    found = _STARVED.search(entry.message)
    resource = found.group(1) if found else ""
    detail = chosen.detail if chosen is not None else {}
    if detail.get("signal"):
        left = f", {detail['available']} available" if detail.get("available") else ""
        pressure = f" under {resource} pressure" if resource else ""
        return (
            f"evicted{pressure}: signal {detail['signal']} ({detail.get('threshold', '')} "
            f"met{left}); chosen because {detail.get('rank', '')}. {entry.message.strip()}"
        )
    if not resource:
        return f"evicted: {entry.message}"
    signal_ = _SIGNAL_OF.get(resource, resource)
    return f"evicted under {resource} pressure (signal {signal_}): {entry.message.strip()}"


def explain(index: HistoryIndexRecord, uid: str, entries: Sequence[HistoryEntry]) -> Story:
    """The answer first, from the newest facts: a pod that failed says why (eviction
    names its signal), one that restarted says how often and what ended the last run,
    one that never started says what it waits for."""
    timeline = tuple(sorted(entries, key=lambda e: e.at))
    restarts = sum(int((c or {}).get("restarts") or 0) for c in index.containers.values())
    failed = _last(timeline, lambda e: e.what == "phase" and e.detail.get("phase") == "Failed")
    evicted = _last(timeline, lambda e: e.reason == "Evicted")
    latest: dict[str, HistoryEntry] = {}  # each container's last start or wait
    for e in timeline:
        if e.what in ("waiting", "started") and e.container:
            latest[e.container] = e
    stuck = [e for e in latest.values() if e.what == "waiting" and e.type == "Warning"]
    if evicted is not None:
        chosen = _last(timeline, lambda e: e.reason == EVICTION_NOTE and e.at <= evicted.at + 60)
        answer = _eviction(evicted, chosen)
    elif failed is not None and index.phase == "Failed":
        answer = f"failed: {failed.reason}: {failed.message}"
    elif restarts:
        times = "time" if restarts == 1 else "times"
        answer = f"restarted {restarts} {times}: {_restart_cause(timeline)}"
    elif stuck:
        e = stuck[-1]
        answer = f"container {e.container} not running: {e.reason}: {e.message}"
    elif (kill := _last(timeline, lambda e: e.reason == "Killing")) is not None:
        answer = f"stopped: {_probe_kill(kill, timeline)}"
    else:
        phase = index.phase or "unknown"
        answer = f"{phase}, never restarted" if phase == "Running" else f"phase {phase}"
    # One line: a probe's output or an exit message may span several.
    return Story(index.namespace, index.name, uid, _one_line(answer), restarts, timeline)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def printable(text: str) -> str:
    """`text` with every control and format character (Unicode categories Cc and Cf:
    C0/C1 controls, ESC, DEL, bidi overrides, zero-width characters) written as its
    escape sequence (`\x1b`, `\u202e`): safe to print on a terminal."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Cf")
        else ch
        for ch in text
    )


def render_text(story: Story) -> str:
    """The answer, then one line per entry: time, who, container, type, reason: message;
    every field `printable`."""
    lines = [
        printable(f"{story.namespace}/{story.name} (uid {story.uid}): {story.answer}"),
        "",
    ]
    rows = [
        tuple(
            printable(_one_line(cell))
            for cell in (
                rfc3339(e.at),
                e.source,
                e.container or "-",
                e.type,
                f"{e.reason}: {e.message}",
            )
        )
        for e in story.timeline
    ]
    head = ("TIME", "SOURCE", "CONTAINER", "TYPE", "WHAT")
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for row in [head, *rows]:
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(row[:4], width, strict=True)) + "  " + row[4]
        )
    return "\n".join(lines) + "\n"


def to_json(story: Story) -> JSON:
    return {
        "namespace": story.namespace,
        "name": story.name,
        "uid": story.uid,
        "answer": story.answer,
        "restarts": story.restarts,
        "timeline": [
            {
                "time": rfc3339(e.at),
                "at": e.at,
                "source": e.source,
                "what": e.what,
                "type": e.type,
                "reason": e.reason,
                "message": e.message,
                **({"container": e.container} if e.container else {}),
                **({"detail": e.detail} if e.detail else {}),
            }
            for e in story.timeline
        ],
    }

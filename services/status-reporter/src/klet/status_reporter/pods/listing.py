"""Pure decisions behind the pod view: which status wins, which pods are listed, and
the PodList the read-only API returns.

Everything here takes plain values and returns new ones, so the rules can be tested
table-driven without Redis or an event loop; `podcache.py` is the I/O shell around them.

Rules, and why:

- Status ordering is `(epoch, version)`, compared as a pair. `version` only increases
  for the lifetime of one syncloop leader; a new leader starts a new, later `epoch` and
  may start counting again from 1. So a lower version of the same epoch is a stale write
  (a reordered or replayed message) and is dropped, while any version of a later epoch
  wins. Equal pairs keep what we have: the writer never reuses a pair for other content,
  and not replacing keeps re-deliveries free of churn.
- Listing is the union of the desired pods and the pods with a non-terminal status. A
  pod removed from the desired set keeps running until syncloop has stopped it, and
  until then it is still this node's pod; once its reported phase is Succeeded or Failed
  it is gone from the list. A status record without a phase counts as not terminal (we
  cannot tell, and hiding a running pod is the worse mistake).
- A listed pod whose spec we never saw (status only, e.g. after a restart of this
  service while the pod was being removed) is shown as a skeleton built from the status
  record's namespace, name and UID rather than being left out.
- The PodList is encoded (`encode_pod_list`) the way Starlette's JSONResponse encodes
  it, so the bytes the view keeps (podcache.py: once per change, not once per reader)
  are the bytes either HTTP endpoint used to produce on every request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from klet.model.records import PodStatusRecord
from klet.model.types import JSON, PodUID

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# What the API shows for a pod syncloop has not reported on yet: the phase the
# apiserver gives a freshly created pod.
PENDING_STATUS: JSON = {"phase": "Pending"}


def supersedes(incoming: PodStatusRecord, current: PodStatusRecord | None) -> bool:
    """Whether `incoming` should replace `current` (see the module docstring)."""
    if current is None:
        return True
    return (incoming.epoch, incoming.version) > (current.epoch, current.version)


def is_terminal(status: JSON) -> bool:
    return status.get("phase") in TERMINAL_PHASES


def merge_statuses(
    current: Mapping[PodUID, PodStatusRecord],
    snapshot: Mapping[PodUID, PodStatusRecord],
    *,
    keep: frozenset[PodUID] = frozenset(),
) -> dict[PodUID, PodStatusRecord]:
    """The statuses after a full reload that read `snapshot` from the table.

    The table decides which pods have a status at all (a UID missing from it is
    dropped: the table is the truth, and a flushed Redis is rebuilt by its writers); for
    a UID in both, the ordering rule decides which record is kept. UIDs in `keep` were
    refreshed from the stream after the snapshot was read, so their current entry (or
    its absence) is newer than the snapshot and is left as it is.
    """
    merged: dict[PodUID, PodStatusRecord] = {}
    for uid, record in snapshot.items():
        if uid in keep:
            continue
        have = current.get(uid)
        merged[uid] = record if have is None or supersedes(record, have) else have
    for uid in keep:
        if uid in current:
            merged[uid] = current[uid]
    return merged


def listed_uids(
    desired: Mapping[PodUID, JSON], statuses: Mapping[PodUID, PodStatusRecord]
) -> set[PodUID]:
    """The union rule: every desired pod, plus every pod whose status is not terminal."""
    listed = set(desired)
    listed.update(uid for uid, rec in statuses.items() if not is_terminal(rec.status))
    return listed


def skeleton_pod(record: PodStatusRecord) -> JSON:
    """A minimal v1 Pod for a listed pod whose spec this process never saw."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": record.name, "namespace": record.namespace, "uid": record.uid},
        "spec": {},
    }


def pod_item(pod: JSON, record: PodStatusRecord | None) -> JSON:
    """`pod` with its `status` replaced by the latest computed one (or Pending).

    A shallow copy: the cached pod and status are shared, never mutated, and the result
    is serialised at once.
    """
    item = dict(pod)
    item["status"] = record.status if record is not None else dict(PENDING_STATUS)
    return item


def _sort_key(item: JSON) -> tuple[str, str, str]:
    meta = item.get("metadata") or {}
    return (
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        str(meta.get("uid", "")),
    )


def pod_list(
    *,
    desired: Mapping[PodUID, JSON],
    departed: Mapping[PodUID, JSON],
    statuses: Mapping[PodUID, PodStatusRecord],
) -> JSON:
    """The v1 PodList of the node's pods, sorted by namespace/name for stable output.

    `departed` holds the last seen spec of pods that left the desired set; it is only
    consulted for pods the union rule still lists.
    """
    items: list[JSON] = []
    for uid in listed_uids(desired, statuses):
        record = statuses.get(uid)
        pod = desired.get(uid)
        if pod is None:
            pod = departed.get(uid)
        if pod is None and record is not None:
            pod = skeleton_pod(record)
        if pod is not None:
            items.append(pod_item(pod, record))
    items.sort(key=_sort_key)
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


def encode_pod_list(pod_list: JSON) -> bytes:
    """`pod_list` as the JSON body of a `/pods` answer: compact, UTF-8, no NaN.

    The same bytes as `starlette.responses.JSONResponse(pod_list).body`, so serving the
    kept encoding instead of a fresh JSONResponse changes nothing a reader sees.
    """
    return json.dumps(
        pod_list, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")

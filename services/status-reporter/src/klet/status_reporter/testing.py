"""Stateful fakes of the bus interfaces `podcache.py` consumes, for unit tests.

They keep real state (a table is a dict of records, the feed is a log with one
consumer group's pending list and acknowledgements) and an `unavailable` switch that
makes every call raise `BusUnavailable`, the way a stopped Redis does. mypy checks them
against the protocols at the bottom of this module. Integration tests use real Redis.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from klet.bus import BusUnavailable, Entry
from klet.model.records import DesiredPod, PodStatusChange, PodStatusRecord, Record
from klet.model.types import JSON, pod_uid
from klet.status_reporter.podcache import DesiredTable, StatusFeed, StatusTable

R = TypeVar("R", bound=Record)


class FakeBusState:
    """The switch shared by the fakes of one bus: flip `unavailable` to stop "Redis"."""

    def __init__(self) -> None:
        self.unavailable = False
        self.calls: list[str] = []

    def check(self, call: str) -> None:
        self.calls.append(call)
        if self.unavailable:
            raise BusUnavailable(f"fake bus down ({call})")


class FakeTable(Generic[R]):
    """A bus table: records by key."""

    def __init__(self, state: FakeBusState | None = None) -> None:
        self.state = state or FakeBusState()
        self.rows: dict[str, R] = {}

    async def get(self, key: str) -> R | None:
        self.state.check("get")
        return self.rows.get(key)

    async def all(self) -> dict[str, R]:
        self.state.check("all")
        return dict(self.rows)


class FakeFeed:
    """A bus stream with one consumer group: a log, a read cursor, a pending list."""

    def __init__(self, state: FakeBusState | None = None) -> None:
        self.state = state or FakeBusState()
        self.log: list[Entry[PodStatusChange]] = []
        self.groups: set[str] = set()
        self.cursor = 0
        self.pending: dict[str, Entry[PodStatusChange]] = {}
        self.acked: list[str] = []

    def publish(self, record: PodStatusChange) -> str:
        entry_id = f"{len(self.log) + 1}-0"
        self.log.append(Entry(entry_id, record))
        return entry_id

    def publish_bad(self, error: str = "not JSON") -> str:
        entry_id = f"{len(self.log) + 1}-0"
        self.log.append(Entry(entry_id, None, error))
        return entry_id

    async def ensure_group(self, group: str) -> None:
        self.state.check("ensure_group")
        self.groups.add(group)

    async def read(
        self, group: str, consumer: str, *, count: int, block_ms: int
    ) -> list[Entry[PodStatusChange]]:
        self.state.check("read")
        if group not in self.groups:
            raise AssertionError(f"read from group {group!r} before ensure_group")
        batch = self.log[self.cursor : self.cursor + count]
        if not batch:
            # Like XREADGROUP BLOCK: an idle read waits, so a consumer loop never spins.
            await asyncio.sleep(block_ms / 1000)
            return []
        self.cursor += len(batch)
        for entry in batch:
            self.pending[entry.id] = entry
        return batch

    async def ack(self, group: str, *ids: str) -> None:
        self.state.check("ack")
        for entry_id in ids:
            if self.pending.pop(entry_id, None) is not None:
                self.acked.append(entry_id)

    async def claim_stale(
        self, group: str, consumer: str, *, min_idle_ms: int
    ) -> list[Entry[PodStatusChange]]:
        self.state.check("claim_stale")
        return list(self.pending.values())


def _conforms(
    desired: FakeTable[DesiredPod], status: FakeTable[PodStatusRecord], feed: FakeFeed
) -> tuple[DesiredTable, StatusTable, StatusFeed]:
    # Never called: makes mypy prove the fakes satisfy the consumer's protocols.
    return desired, status, feed


# -- record builders (shared by unit and integration tests) ---------------------------


def make_pod(name: str, *, namespace: str = "default", uid: str | None = None) -> JSON:
    """A small v1 Pod as pod-source would store it (one container, no status)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    }


def desired_record(pod: JSON, *, seen_at: float = 1.0) -> DesiredPod:
    return DesiredPod(uid=pod_uid(pod), pod=pod, source="file", hash="h", seen_at=seen_at)


def status_record(
    pod: JSON,
    *,
    version: int,
    epoch: float = 1.0,
    phase: str = "Running",
    status: JSON | None = None,
) -> PodStatusRecord:
    """The status syncloop would write for `pod`; `status` overrides the whole PodStatus."""
    meta = pod["metadata"]
    return PodStatusRecord(
        uid=pod_uid(pod),
        namespace=meta["namespace"],
        name=meta["name"],
        version=version,
        epoch=epoch,
        status=status if status is not None else {"phase": phase},
        updated_at=float(version),
    )

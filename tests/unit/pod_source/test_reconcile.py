"""Level repair of the bus tables: what is written so `desired` and `sources` match the
merged state, which entries are left alone (sources not read yet) and which are removed
(gone from a ready source, or from a source no longer configured)."""

from __future__ import annotations

from typing import Any

from klet.model.records import DesiredPod, SourceName, SourceState
from klet.model.types import PodUID
from klet.pod_source.podconfig import PodConfigState, merge_snapshot
from klet.pod_source.reconcile import plan_reconcile, to_record

T0, T1 = 1_700_000_000.0, 1_700_000_100.0
BOTH: frozenset[SourceName] = frozenset({"file", "http"})


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
    }


def record(name: str, source: Any = "file") -> DesiredPod:
    return DesiredPod(uid=PodUID(f"uid-{name}"), pod=pod(name), source=source, hash="", seen_at=T0)


def file_state(*names: str) -> PodConfigState:
    state, _ = merge_snapshot(PodConfigState(), "file", [pod(n) for n in names], T0)
    return state


def test_flushed_redis_is_rewritten_whole() -> None:
    state = file_state("a", "b")
    plan = plan_reconcile(state, configured=BOTH, desired={}, sources={}, now=T1)
    assert [(op, r.uid) for op, r in plan.puts] == [("ADD", "uid-a"), ("ADD", "uid-b")]
    assert plan.source_puts == (
        SourceState(source="file", ready=True, at=T1),
        SourceState(source="http", ready=False, at=T1),
    )
    assert plan.removes == () and plan.source_deletes == ()


def test_in_sync_tables_need_nothing() -> None:
    state = file_state("a")
    desired = {str(uid): to_record(p) for uid, p in state.ready_pods().items()}
    sources = {
        "file": SourceState(source="file", ready=True, at=T0),
        "http": SourceState(source="http", ready=False, at=T0),
    }
    assert plan_reconcile(state, configured=BOTH, desired=desired, sources=sources, now=T1).empty


def test_extra_entry_of_a_ready_source_is_removed() -> None:
    state = file_state("a")
    desired = {"uid-a": to_record(state.ready_pods()[PodUID("uid-a")]), "uid-x": record("x")}
    plan = plan_reconcile(state, configured=BOTH, desired=desired, sources={}, now=T1)
    assert [(k, r.source) for k, r in plan.removes] == [("uid-x", "file")]


def test_entries_of_a_source_not_read_yet_are_kept() -> None:
    state = file_state("a")
    desired = {"uid-h": record("h", source="http")}
    sources = {"http": SourceState(source="http", ready=True, at=T0)}
    plan = plan_reconcile(state, configured=BOTH, desired=desired, sources=sources, now=T1)
    assert plan.removes == () and plan.source_deletes == ()


def test_entries_of_an_unconfigured_source_are_removed() -> None:
    state = file_state()
    desired = {"uid-p": record("p", source="api")}
    sources = {"api": SourceState(source="api", ready=True, at=T0)}
    plan = plan_reconcile(state, configured=BOTH, desired=desired, sources=sources, now=T1)
    assert [k for k, _ in plan.removes] == ["uid-p"]
    assert plan.source_deletes == ("api",)


def test_changed_entry_gets_the_right_operation() -> None:
    state = file_state("a")
    stale = DesiredPod(
        uid=PodUID("uid-a"), pod=pod("a", restartPolicy="Never"), source="file", hash="", seen_at=T0
    )
    plan = plan_reconcile(state, configured=BOTH, desired={"uid-a": stale}, sources={}, now=T1)
    assert [op for op, _ in plan.puts] == ["UPDATE"]


def test_bookkeeping_only_difference_is_rewritten_silently() -> None:
    state = file_state("a")
    current = to_record(state.ready_pods()[PodUID("uid-a")])
    older = DesiredPod(
        uid=current.uid, pod=current.pod, source="file", hash=current.hash, seen_at=T0 - 5
    )
    plan = plan_reconcile(state, configured=BOTH, desired={"uid-a": older}, sources={}, now=T1)
    assert [(op, r) for op, r in plan.puts] == [(None, current)]


def test_not_ready_sources_entry_is_fixed() -> None:
    state = file_state()
    sources = {
        "file": SourceState(source="file", ready=False, at=T0),
        "http": SourceState(source="http", ready=False, at=T0),
    }
    plan = plan_reconcile(state, configured=BOTH, desired={}, sources=sources, now=T1)
    assert plan.source_puts == (SourceState(source="file", ready=True, at=T1),)


def test_configured_source_not_read_yet_is_published_not_ready() -> None:
    """Readers must never see "every source ready" while a configured one is loading."""
    state = file_state("a")  # file has reported; http (say, an unreachable URL) has not
    plan = plan_reconcile(state, configured=BOTH, desired={}, sources={}, now=T1)
    assert SourceState(source="http", ready=False, at=T1) in plan.source_puts
    existing = {"http": SourceState(source="http", ready=True, at=T0)}  # a previous run's
    plan = plan_reconcile(state, configured=BOTH, desired={}, sources=existing, now=T1)
    assert all(s.source != "http" for s in plan.source_puts)

"""Probe decisions (probes.py): defaults, timing, gating and threshold counting.

Covers: API defaults for every timing field and the forced success threshold of 1 for
liveness and startup; which handler a probe uses and a probe without one being
ignored; initial results per kind; the first probe after initialDelaySeconds, the
start-up jitter only while the prober is younger than one period; the period between
probes; startup gating of liveness/readiness and the quiet stop of liveness/startup on
deletion; success/failure thresholds counted in a row, the counter reset by a changed
outcome, and the hold after a liveness failure or a startup result; `started` with and
without a startup probe; the running containers a published status carries over a
restart; the upstream event texts.
"""

from __future__ import annotations

from typing import Any

import pytest
from klet.syncloop.probing import probes
from klet.syncloop.probing.proberesults import ProbeKind
from klet.syncloop.probing.probes import Counter, Gate, ProbeSpec

L, R, S = ProbeKind.LIVENESS, ProbeKind.READINESS, ProbeKind.STARTUP


def container(**probes_: Any) -> dict[str, Any]:
    return {"name": "app", "image": "busybox", **probes_}


EXEC = {"exec": {"command": ["true"]}}


@pytest.mark.parametrize(
    ("field", "probe", "kind", "expected"),
    [
        (
            "livenessProbe",
            EXEC,
            L,
            ProbeSpec(L, "exec", {"command": ["true"]}, 0, 10, 1, 1, 3, None),
        ),
        (
            "readinessProbe",
            {
                "httpGet": {"port": 80, "path": "/"},
                "initialDelaySeconds": 5,
                "periodSeconds": 2,
                "timeoutSeconds": 3,
                "successThreshold": 2,
                "failureThreshold": 4,
            },
            R,
            ProbeSpec(R, "httpGet", {"port": 80, "path": "/"}, 5, 2, 3, 2, 4, None),
        ),
        (
            "startupProbe",
            {"tcpSocket": {"port": 8080}, "successThreshold": 5, "failureThreshold": 30},
            S,
            ProbeSpec(S, "tcpSocket", {"port": 8080}, 0, 10, 1, 1, 30, None),
        ),
        (
            "livenessProbe",
            {"grpc": {"port": 9000}, "terminationGracePeriodSeconds": 7, "successThreshold": 3},
            L,
            ProbeSpec(L, "grpc", {"port": 9000}, 0, 10, 1, 1, 3, 7),
        ),
        (
            "readinessProbe",
            {**EXEC, "periodSeconds": 0, "timeoutSeconds": 0, "failureThreshold": 0},
            R,
            ProbeSpec(R, "exec", {"command": ["true"]}, 0, 10, 1, 1, 3, None),
        ),
    ],
)
def test_probe_spec_defaults(
    field: str, probe: dict[str, Any], kind: ProbeKind, expected: ProbeSpec
) -> None:
    assert probes.probe_spec(container(**{field: probe}), kind) == expected


def test_probe_without_handler_or_absent_is_none() -> None:
    assert probes.probe_spec(container(livenessProbe={"periodSeconds": 3}), L) is None
    assert probes.probe_spec(container(), R) is None
    assert probes.probe_spec(container(livenessProbe=EXEC), R) is None


def test_container_probes_lists_startup_first() -> None:
    c = container(livenessProbe=EXEC, readinessProbe=EXEC, startupProbe=EXEC)
    assert [s.kind for s in probes.container_probes(c)] == [S, R, L]


@pytest.mark.parametrize(("kind", "initial"), [(R, False), (L, True), (S, None)])
def test_initial_results(kind: ProbeKind, initial: bool | None) -> None:
    assert probes.initial_result(kind) is initial


def spec(kind: ProbeKind = R, **kw: Any) -> ProbeSpec:
    return ProbeSpec(kind, "exec", {"command": ["true"]}, **kw)


@pytest.mark.parametrize(
    ("kw", "started_at", "now", "prober_started_at", "jitter", "expected"),
    [
        # prober running for long: no jitter; no delay → now
        ({}, 100.0, 500.0, 0.0, 0.9, 500.0),
        # initial delay counts from the container's start
        ({"initial_delay_s": 30}, 490.0, 500.0, 0.0, 0.9, 520.0),
        # initial delay already over
        ({"initial_delay_s": 30}, 400.0, 500.0, 0.0, 0.9, 500.0),
        # prober younger than one period: jitter part of a period
        ({"period_s": 10}, 100.0, 500.0, 495.0, 0.5, 505.0),
        # jitter and initial delay: the later one wins
        ({"period_s": 10, "initial_delay_s": 20}, 500.0, 500.0, 495.0, 0.5, 520.0),
    ],
)
def test_first_probe_at(
    kw: dict[str, Any],
    started_at: float,
    now: float,
    prober_started_at: float,
    jitter: float,
    expected: float,
) -> None:
    at = probes.first_probe_at(
        spec(**kw),
        container_started_at=started_at,
        now=now,
        prober_started_at=prober_started_at,
        jitter=jitter,
    )
    assert at == expected


@pytest.mark.parametrize(
    ("handler", "carried", "expected"),
    [
        ("httpGet", True, 500.25),  # a carried result is checked within half a second
        ("tcpSocket", True, 500.25),
        ("grpc", True, 500.25),
        ("exec", True, 505.0),  # a process per probe: the period's spread stays
        ("httpGet", False, 505.0),  # nothing carried: upstream's spread
    ],
)
def test_a_carried_result_is_checked_soon(handler: str, carried: bool, expected: float) -> None:
    at = probes.first_probe_at(
        ProbeSpec(R, handler, {}, period_s=10),
        container_started_at=100.0,
        now=500.0,
        prober_started_at=499.0,
        jitter=0.5,
        carried=carried,
    )
    assert at == expected


def test_carried_instances_are_the_running_containers_of_a_status() -> None:
    status = {
        "initContainerStatuses": [
            {"name": "sidecar", "containerID": "containerd://s1", "ready": False,
             "started": True, "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}},
        ],
        "containerStatuses": [
            {"name": "app", "containerID": "containerd://a1", "ready": True,
             "started": True, "state": {"running": {}}},
            {"name": "done", "containerID": "containerd://d1", "ready": False,
             "state": {"terminated": {"exitCode": 0}}},
            {"name": "waiting", "containerID": "", "state": {"running": {}}},
        ],
    }  # fmt: skip
    assert probes.carried_instances(status) == [
        probes.CarriedInstance("s1", "sidecar", 1795946400.0, probes.CarriedProbes(False, True)),
        probes.CarriedInstance("a1", "app", None, probes.CarriedProbes(True, True)),
    ]
    assert probes.carried_instances({}) == []


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [(100.0, 101.0, 110.0), (100.0, 115.0, 115.0), (100.0, 110.0, 110.0)],
)
def test_next_probe_at(last: float, now: float, expected: float) -> None:
    assert probes.next_probe_at(spec(period_s=10), last_probe_at=last, now=now) == expected


@pytest.mark.parametrize(
    ("kind", "started", "deleting", "expected"),
    [
        (S, False, False, Gate.RUN),
        (S, True, False, Gate.SKIP),
        (R, False, False, Gate.SKIP),
        (L, False, False, Gate.SKIP),
        (R, True, False, Gate.RUN),
        (L, True, False, Gate.RUN),
        (L, True, True, Gate.STOP_SUCCESS),
        (S, False, True, Gate.STOP_SUCCESS),
        (R, True, True, Gate.RUN),  # readiness keeps probing while the pod terminates
    ],
)
def test_gate(kind: ProbeKind, started: bool, deleting: bool, expected: Gate) -> None:
    assert probes.gate(kind, started=started, deleting=deleting) == expected


def run(s: ProbeSpec, outcomes: list[bool]) -> list[tuple[bool | None, bool]]:
    """(published, hold) after each outcome."""
    counter = Counter()
    out = []
    for ok in outcomes:
        step = probes.record(s, counter, ok)
        counter = step.counter
        out.append((step.publish, step.hold))
    return out


F, T, N = False, True, None


@pytest.mark.parametrize(
    ("s", "outcomes", "expected"),
    [
        # readiness, thresholds 1/3: success publishes at once, failure after three in a row
        (spec(R), [T, F, F, F, F], [(T, F), (N, F), (N, F), (F, F), (F, F)]),
        # a success in between restarts the failure count
        (spec(R), [F, F, T, F, F, F], [(N, F), (N, F), (T, F), (N, F), (N, F), (F, F)]),
        # successThreshold 2: two successes in a row before ready
        (spec(R, success_threshold=2), [T, F, T, T], [(N, F), (N, F), (N, F), (T, F)]),
        # failureThreshold 1: the first failure publishes
        (spec(R, failure_threshold=1), [F, T], [(F, F), (T, F)]),
        # liveness: successes publish without hold; the third failure publishes and holds
        (spec(L), [T, F, F, F], [(T, F), (N, F), (N, F), (F, T)]),
        # startup: the first success publishes and holds
        (spec(S), [F, T], [(N, F), (T, T)]),
        # startup: failureThreshold failures publish failure and hold
        (spec(S, failure_threshold=2), [F, F], [(N, F), (F, T)]),
    ],
)
def test_record_thresholds(
    s: ProbeSpec, outcomes: list[bool], expected: list[tuple[bool | None, bool]]
) -> None:
    assert run(s, outcomes) == expected


def test_record_resets_the_run_after_a_hold() -> None:
    step = probes.record(spec(L, failure_threshold=1), Counter(), False)
    assert step.hold and step.counter.run == 0


@pytest.mark.parametrize(
    ("probes_", "running", "startup", "expected"),
    [
        ({}, True, None, True),
        ({}, False, None, False),
        ({"startupProbe": EXEC}, True, None, False),
        ({"startupProbe": EXEC}, True, False, False),
        ({"startupProbe": EXEC}, True, True, True),
        ({"startupProbe": EXEC}, False, True, False),
    ],
)
def test_container_started(
    probes_: dict[str, Any], running: bool, startup: bool | None, expected: bool
) -> None:
    assert probes.container_started(container(**probes_), running=running, startup=startup) is (
        expected
    )


def test_event_texts() -> None:
    assert probes.failure_event(L, "boom") == ("Unhealthy", "Liveness probe failed: boom")
    assert probes.failure_event(R, "x") == ("Unhealthy", "Readiness probe failed: x")
    assert probes.failure_event(S, "") == ("Unhealthy", "Startup probe failed: ")
    assert probes.warning_event(R, "Probe terminated redirects, Response body: ") == (
        "ProbeWarning",
        "Readiness probe warning: Probe terminated redirects, Response body: ",
    )
    assert probes.error_event(L, "port x not found") == (
        "Unhealthy",
        "Liveness probe errored and resulted in unknown state: port x not found",
    )

"""Probe decisions as pure functions: timing, thresholds and gating (upstream prober worker).

The prober (prober.py) runs one task per (container instance, probe kind) and asks these
functions what to do; times are arguments, nothing here sleeps or does I/O.

- Defaults as the API server sets them: periodSeconds 10, timeoutSeconds 1,
  successThreshold 1, failureThreshold 3, initialDelaySeconds 0. Liveness and startup
  probes always use a success threshold of 1 (the API rejects anything else).
- Initial results, published when a worker starts: readiness fails until the first
  success, liveness succeeds until it fails, startup is unknown until it resolves.
- A probe is not run before initialDelaySeconds have passed since the container started.
  If the prober itself started less than one period ago (a restarted syncloop), the
  first run is additionally delayed by a random part of one period so that every probe
  does not fire at once.
- Liveness and readiness wait until the container has started (its startup probe, if
  any, succeeded); the startup probe runs only until then.
- A result is published once the same outcome came `threshold` times in a row; a
  probe error (the handler could not run) is thrown away and does not count.
- After a published liveness failure, or any published startup result, the worker is
  on hold: the instance gets killed, or has started, and a new instance gets new workers.
- Once the pod is being deleted liveness and startup report success and stop, so a
  terminating container is never restarted by them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from klet.model.podhistory import parse_time
from klet.model.types import JSON
from klet.syncloop.probing.proberesults import ProbeKind

DEFAULT_PERIOD_S = 10
DEFAULT_TIMEOUT_S = 1
DEFAULT_SUCCESS_THRESHOLD = 1
DEFAULT_FAILURE_THRESHOLD = 3
MAX_PROBE_RETRIES = 3  # upstream maxProbeRetries: attempts when the handler errors

SPEC_FIELDS = {
    ProbeKind.LIVENESS: "livenessProbe",
    ProbeKind.READINESS: "readinessProbe",
    ProbeKind.STARTUP: "startupProbe",
}
HANDLER_KINDS = ("exec", "httpGet", "tcpSocket", "grpc")


@dataclass(frozen=True)
class ProbeSpec:
    """One probe of a container with every default applied; times in seconds."""

    kind: ProbeKind
    handler: str  # exec, httpGet, tcpSocket or grpc
    action: JSON  # the handler's own fields (command, port, path, ...)
    initial_delay_s: int = 0
    period_s: int = DEFAULT_PERIOD_S
    timeout_s: int = DEFAULT_TIMEOUT_S
    success_threshold: int = DEFAULT_SUCCESS_THRESHOLD
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    termination_grace_s: int | None = None


def _positive(value: object, default: int) -> int:
    """A field that must be at least 1: unset or 0 means the default (API defaulting)."""
    if value is None or isinstance(value, bool):
        return default
    number = int(str(value))
    return number if number > 0 else default


def probe_spec(container: JSON, kind: ProbeKind) -> ProbeSpec | None:
    """The container's probe of `kind`, defaulted; None when it has none (or no handler)."""
    probe = container.get(SPEC_FIELDS[kind])
    if not isinstance(probe, dict):
        return None
    handler = next((h for h in HANDLER_KINDS if isinstance(probe.get(h), dict)), None)
    if handler is None:
        return None
    success = _positive(probe.get("successThreshold"), DEFAULT_SUCCESS_THRESHOLD)
    if kind != ProbeKind.READINESS:
        success = 1
    grace = probe.get("terminationGracePeriodSeconds")
    return ProbeSpec(
        kind=kind,
        handler=handler,
        action=dict(probe[handler]),
        initial_delay_s=max(0, int(probe.get("initialDelaySeconds") or 0)),
        period_s=_positive(probe.get("periodSeconds"), DEFAULT_PERIOD_S),
        timeout_s=_positive(probe.get("timeoutSeconds"), DEFAULT_TIMEOUT_S),
        success_threshold=success,
        failure_threshold=_positive(probe.get("failureThreshold"), DEFAULT_FAILURE_THRESHOLD),
        termination_grace_s=None if grace is None else int(grace),
    )


def container_probes(container: JSON) -> list[ProbeSpec]:
    """Every probe a container declares, startup first."""
    order = (ProbeKind.STARTUP, ProbeKind.READINESS, ProbeKind.LIVENESS)
    return [s for s in (probe_spec(container, k) for k in order) if s is not None]


def initial_result(kind: ProbeKind) -> bool | None:
    """What a new worker publishes before its first result (upstream initialValue)."""
    if kind == ProbeKind.READINESS:
        return False
    if kind == ProbeKind.LIVENESS:
        return True
    return None


@dataclass(frozen=True)
class CarriedProbes:
    """What a container's status said of its probes when syncloop last published it."""

    ready: bool
    started: bool


def carried_from_status(status: JSON) -> dict[str, CarriedProbes]:
    """The running containers of a published status by container ID (without the
    runtime's `containerd://`), with their readiness and `started`."""
    out: dict[str, CarriedProbes] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            if not isinstance(cs, dict) or "running" not in (cs.get("state") or {}):
                continue
            cid = str(cs.get("containerID") or "").partition("://")[2]
            if cid:
                out[cid] = CarriedProbes(bool(cs.get("ready")), bool(cs.get("started")))
    return out


@dataclass(frozen=True)
class CarriedInstance:
    """A container a published status showed running: enough to probe it before the
    restarted syncloop has read it from the runtime."""

    container_id: str  # without the runtime's `containerd://`
    name: str
    started_at: float | None  # seconds since the epoch; None if the status has no time
    probes: CarriedProbes


def carried_instances(status: JSON) -> list[CarriedInstance]:
    """The running containers of a published status, with what it said of their probes
    (`carried_from_status`) and when each started (state.running.startedAt)."""
    out: list[CarriedInstance] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            if not isinstance(cs, dict):
                continue
            running = (cs.get("state") or {}).get("running")
            cid = str(cs.get("containerID") or "").partition("://")[2]
            if not isinstance(running, dict) or not cid or not cs.get("name"):
                continue
            out.append(
                CarriedInstance(
                    container_id=cid,
                    name=str(cs["name"]),
                    started_at=parse_time(running.get("startedAt")),
                    probes=CarriedProbes(bool(cs.get("ready")), bool(cs.get("started"))),
                )
            )
    return out


def starting_result(kind: ProbeKind, carried: CarriedProbes | None) -> bool | None:
    """What a new worker publishes before its first result: upstream's initial value,
    or, for a container that ran before syncloop restarted, what was published of it
    then (its readiness and whether it had started). Upstream's restarted kubelet makes
    every container unready until its first probe, which takes it out of its Services'
    endpoints for up to a period; a restarted syncloop is not a restarted node, and the
    next probe corrects a result that changed while it was away."""
    if carried is not None:
        if kind == ProbeKind.READINESS:
            return carried.ready
        if kind == ProbeKind.STARTUP and carried.started:
            return True
    return initial_result(kind)


CARRIED_CHECK_S = 0.5
"""A restarted prober checks a carried result within this (a cheap handler's): half a
second, so 110 httpGet checks are about 220 requests a second for that half second,
and a readiness that changed while syncloop was away is seen sooner (issue 42's soak:
with 1 s, a SIGKILLed syncloop converged in 2.16 s at worst, the spread its largest
part after the first sync)."""


def first_probe_at(
    spec: ProbeSpec,
    *,
    container_started_at: float,
    now: float,
    prober_started_at: float,
    jitter: float,
    carried: bool = False,
) -> float:
    """When a new worker runs its first probe.

    `jitter` in [0, 1) spreads the first probes over one period when the prober itself
    started less than a period ago; the initial delay counts from the container's start.
    A result `carried` over a syncloop restart is a guess to check soon: an httpGet,
    tcpSocket or gRPC probe (cheap, syncloop's own request) is spread over at most
    CARRIED_CHECK_S instead, so a readiness that changed while syncloop was away is seen
    within about half a second; exec probes (a process in the container each) keep the
    period's spread.
    """
    at = now
    if now - prober_started_at < spec.period_s:
        window = float(spec.period_s)
        if carried and spec.handler != "exec":
            window = min(window, CARRIED_CHECK_S)
        at += jitter * window
    return max(at, container_started_at + spec.initial_delay_s)


def next_probe_at(spec: ProbeSpec, *, last_probe_at: float, now: float) -> float:
    """One period after the previous probe began, or now if that has already passed."""
    return max(now, last_probe_at + spec.period_s)


class Gate(Enum):
    RUN = "run"
    SKIP = "skip"  # not this time: wait another period
    STOP_SUCCESS = "stop-success"  # publish success and end the worker


def gate(kind: ProbeKind, *, started: bool, deleting: bool) -> Gate:
    """Whether a due probe runs: startup gating and the quiet shutdown of a deleted pod."""
    if deleting and kind in (ProbeKind.LIVENESS, ProbeKind.STARTUP):
        return Gate.STOP_SUCCESS
    if kind == ProbeKind.STARTUP:
        return Gate.SKIP if started else Gate.RUN
    return Gate.RUN if started else Gate.SKIP


@dataclass(frozen=True)
class Counter:
    """The worker's memory between probes: the last outcome and how often in a row."""

    last: bool | None = None
    run: int = 0


@dataclass(frozen=True)
class Step:
    counter: Counter
    publish: bool | None  # the result to publish, or None to leave the published one
    hold: bool  # stop probing this container instance


def record(spec: ProbeSpec, counter: Counter, ok: bool) -> Step:
    """Count one probe outcome against the thresholds (upstream doProbe)."""
    run = counter.run + 1 if counter.last is ok else 1
    threshold = spec.success_threshold if ok else spec.failure_threshold
    if run < threshold:
        return Step(Counter(ok, run), None, False)
    hold = spec.kind == ProbeKind.STARTUP or (spec.kind == ProbeKind.LIVENESS and not ok)
    return Step(Counter(ok, 0 if hold else run), ok, hold)


def container_started(container: JSON, *, running: bool, startup: bool | None) -> bool:
    """A running container has started once its startup probe (if any) succeeded."""
    if not running:
        return False
    if probe_spec(container, ProbeKind.STARTUP) is None:
        return True
    return startup is True


def failure_event(kind: ProbeKind, message: str) -> tuple[str, str]:
    """(reason, message) of the Warning event for a failed probe."""
    return "Unhealthy", f"{kind.value} probe failed: {message}"


def warning_event(kind: ProbeKind, message: str) -> tuple[str, str]:
    """(reason, message) of the Warning event for a success with a warning (redirect)."""
    return "ProbeWarning", f"{kind.value} probe warning: {message}"


def error_event(kind: ProbeKind, message: str) -> tuple[str, str]:
    """(reason, message) of the Warning event for a probe that could not run at all."""
    return "Unhealthy", f"{kind.value} probe errored and resulted in unknown state: {message}"

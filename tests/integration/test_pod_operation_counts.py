"""What one static pod's life costs in operations, standalone, on real containerd and a
private Redis (issue 42: count per pod lifecycle, then remove what is done twice).

Two pods (after an uncounted warm-up pod) are run one after the other, each created ->
Running (every container ready in `/pods`) -> manifest removed -> gone (no sandbox in
CRI, not in `/pods`). Around each phase the test reads every service's
`kubelet_runtime_operations_total` (the CRI calls it made itself, by upstream's
operation type) and cuts the private Redis's MONITOR output at marker commands: every
command the node's services sent (the bus round trips, a pipeline's commands one by one)
and, apart, the commands a Redis function ran for an FCALL, by command and bus key (an
FCALL counts under its first key, the writer's lease; the ones that append Events count
once more per events stream, so a batch of Events shows as one write). An
idle window as long as a mean lifecycle is counted too, so the periodic passes (pod
view reload, leases, consumer reads) can be told from what the pod caused; it lasts at
least `IDLE_MIN_S`, so one round of log rotation (containerLogMonitorInterval, 10 s)
falls inside it. The tables
are printed (`-s`) and written as JSON to `$KLET_OPCOUNTS_OUT` when set; bench/README.md
shows one run.

Asserted are only the counts that are design rules, never a time: syncloop starts each
pod with one RunPodSandbox, one CreateContainer and one StartContainer; no service but
syncloop makes a lifecycle call (run, create, start, stop, remove, update); and it stops
a pod without polling the runtime (StopContainer and StopPodSandbox are synchronous):
at most `STOP_CONTAINER_STATUS` ContainerStatus and `STOP_SANDBOX_STATUS`
PodSandboxStatus calls per removed one-container pod (13-21 and 3-9 before the
evented PLEG stopped confirming the exits a worker caused itself); and status-reporter
fetches each announced status change once (no more HMGETs of `status` than XADDs to
`podstatus`, over all phases: its pod view and its history recorder each fetched it
before the history took the view's changes); the fenced writes look up no type of a
pod's `history:<uid>` (15 TYPE per start before they looked each key up once a call and
never for a call's first write); and syncloop's idle node lists containers only in its
relists, which list the sandboxes too (log rotation listed every container every 10 s;
it now takes PLEG's view). No apiserver: in standalone mode there is no apiserver write
to count.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from klet.devstack import DevStack, RedisServer
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.node import SERVICES, KletNode
from tests.harness.pods import running, runtime_sandboxes
from tests.harness.waiting import wait_for

OPS = "kubelet_runtime_operations"
LIFECYCLE = (
    "run_podsandbox",
    "create_container",
    "start_container",
    "stop_container",
    "remove_container",
    "stop_podsandbox",
    "remove_podsandbox",
    "update_container",
)
CRI_SERVICES = tuple(s for s in SERVICES if s != "pod-source")  # pod-source has no CRI
PODS = 2
# The worker's read of the pod before the kill (one of each) and the PID lookup before a
# graceful StopContainer (execwait.py), plus one read of each for the sync a start owes
# itself (it wakes at once after starting), which a loaded machine may let fall after
# the manifest's removal.
STOP_CONTAINER_STATUS = 3
STOP_SANDBOX_STATUS = 2
# containerLogMonitorInterval (10 s) and a margin: the idle window holds a rotation round.
IDLE_MIN_S = 12.0

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
"""

Counts = Counter[str]
MARK = "klet-opcount:"


def cri_counts(node: KletNode) -> Counts:
    """`<service>/<operation_type>` -> calls so far, from each service's /metrics."""
    out: Counts = Counter()
    for service in CRI_SERVICES:
        for family in text_string_to_metric_families(node.metrics(service)):
            if family.name != OPS:
                continue
            for sample in family.samples:
                if sample.name == f"{OPS}_total":
                    out[f"{service}/{sample.labels['operation_type']}"] += int(sample.value)
    return out


class Monitor:
    """Every command the private Redis runs, from `redis-cli MONITOR` (as the admin),
    cut into phases by marker commands (ECHO) this test sends: MONITOR shows commands
    in the order Redis ran them, so a marker falls exactly between two phases. A command
    a client sent is told from one a Redis function ran for it (MONITOR shows those as
    `[0 lua]`): the client's are the bus round trips (a pipeline's commands counted one
    by one), the function's are the work each FCALL does inside Redis."""

    def __init__(self, redis: RedisServer, log: Path) -> None:
        self.redis, self.log = redis, log
        self._out = log.open("w")
        # The password through the environment, not on a command line ps shows.
        self._env = {**os.environ, "REDISCLI_AUTH": redis.admin.password}
        self._proc = subprocess.Popen(
            [*self._cli(), "MONITOR"], stdout=self._out, stderr=subprocess.STDOUT, env=self._env
        )
        # MONITOR answers OK once it watches: a mark sent before that would be missed.
        wait_for(lambda: self.log.read_text().startswith("OK"), timeout_s=10, what="MONITOR")
        self.mark("monitor-started")

    def _cli(self) -> list[str]:
        user = self.redis.admin.username
        return ["redis-cli", "-s", str(self.redis.socket_path), "--user", user]

    def mark(self, label: str) -> str:
        subprocess.run(
            [*self._cli(), "ECHO", f"{MARK}{label}"],
            capture_output=True, check=True, timeout=10, env=self._env,
        )  # fmt: skip
        wait_for(lambda: f"{MARK}{label}" in self.log.read_text(), timeout_s=10, what=label)
        return label

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._out.close()

    def between(self, first: str, last: str) -> Counts:
        """`client <command> <key family>` / `in-function ...` -> count, between two
        marks."""
        out: Counts = Counter()
        inside = False
        for line in self.log.read_text().splitlines():
            if f'"{MARK}{first}"' in line:
                inside = True
                continue
            if f'"{MARK}{last}"' in line:
                return out
            if not inside or "] " not in line:
                continue
            where, _, command = line.partition("] ")
            words = re.findall(r'"((?:[^"\\]|\\.)*)"', command)
            if not words or words[0].upper() in ("ECHO", "AUTH"):  # the marks' own
                continue
            source = "in-function" if where.endswith("lua") else "client"
            out[f"{source} {words[0].lower()} {_family(words[1:])}".rstrip()] += 1
            if source == "client" and words[0].upper() == "FCALL":
                # The fenced calls that carry Events: a call is counted under its
                # first key (the lease), one row per events stream it appends to.
                for family in dict.fromkeys(_family([w]) for w in words[1:]):
                    if family.startswith("events:"):
                        out[f"client fcall carrying {family}"] += 1
        raise AssertionError(f"no mark {last} in {self.log}")


def _family(args: list[str]) -> str:
    """The bus key among a command's arguments, without node and pod UID: `status`,
    `events:syncloop`, `history:<uid>` ..."""
    for arg in args:
        if arg.startswith("klet:"):
            name = arg.split(":", 2)[2] if arg.count(":") >= 2 else arg
            return re.sub(r"[0-9a-f]{8}(-?[0-9a-f]{4}){3}-?[0-9a-f]{12}", "<uid>", name)
    return ""


def gone(node: KletNode, stack: DevStack, name: str) -> bool:
    full = f"{name}-{node.node_name}"
    return full not in node.pods() and not runtime_sandboxes(stack, full)


def table(rows: dict[str, list[Counts]]) -> str:
    """Markdown: one row per counter, one column per phase (mean over the pods)."""
    keys = sorted({k for phase in rows.values() for c in phase for k in c})
    head = "| operation | " + " | ".join(rows) + " |"
    lines = [head, "|---" * (len(rows) + 1) + "|"]
    for key in keys:
        cells = [f"{sum(c[key] for c in phase) / len(phase):g}" for phase in rows.values()]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@pytest.fixture
def node(node_factory: Any, manifests: Path, redis_server: RedisServer) -> Iterator[KletNode]:
    # The default relist (20 s, not the harness's 1 s): counted as operators run it.
    n: KletNode = node_factory(
        manifest_dir=manifests,
        redis=redis_server,
        extra_flags=["--evented-pleg-relist-period", "20s"],
    )
    n.start()
    yield n


def test_operations_per_pod_lifecycle(
    node: KletNode,
    manifests: Path,
    devstack: DevStack,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    # Warm-up: the first pod pays one-time costs (image status cache, first relist).
    (manifests / "warm.yaml").write_text(POD.format(name="warm"))
    wait_for(lambda: running(node, "warm"), timeout_s=30, what="warm Running")
    (manifests / "warm.yaml").unlink()
    wait_for(lambda: gone(node, devstack, "warm"), timeout_s=30, what="warm gone")

    monitor = Monitor(redis_server, tmp_path / "monitor.log")
    cri: dict[str, list[Counts]] = {"start": [], "stop": []}
    bus: dict[str, list[Counts]] = {"start": [], "stop": []}
    durations: list[float] = []
    try:
        for i in range(PODS):
            name = f"p{i}"
            began = time.monotonic()
            before, mark = cri_counts(node), monitor.mark(f"{name}-write")
            (manifests / f"{name}.yaml").write_text(POD.format(name=name))
            wait_for(partial(running, node, name), timeout_s=30, what=f"{name} Running")
            cri["start"].append(cri_counts(node) - before)
            bus["start"].append(monitor.between(mark, monitor.mark(f"{name}-running")))
            before, mark = cri_counts(node), monitor.mark(f"{name}-remove")
            (manifests / f"{name}.yaml").unlink()
            wait_for(partial(gone, node, devstack, name), timeout_s=30, what=f"{name} gone")
            cri["stop"].append(cri_counts(node) - before)
            bus["stop"].append(monitor.between(mark, monitor.mark(f"{name}-gone")))
            durations.append(time.monotonic() - began)
        # As long again as a mean lifecycle with nothing to do: the periodic work of
        # that much time, to read the columns above against.
        before, mark = cri_counts(node), monitor.mark("idle")
        time.sleep(max(IDLE_MIN_S, sum(durations) / len(durations)))
        cri["idle"] = [cri_counts(node) - before]
        bus["idle"] = [monitor.between(mark, monitor.mark("idle-end"))]
    finally:
        monitor.stop()

    for counts in cri["start"]:
        for op in ("run_podsandbox", "create_container", "start_container"):
            assert counts[f"syncloop/{op}"] == 1, (op, counts)
    for counts in cri["stop"]:
        assert counts["syncloop/container_status"] <= STOP_CONTAINER_STATUS, counts
        assert counts["syncloop/podsandbox_status"] <= STOP_SANDBOX_STATUS, counts
    everything = sum((c for phase in bus.values() for c in phase), Counter())
    fetched, announced = everything["client hmget status"], everything["in-function xadd podstatus"]
    assert 0 < fetched <= announced, (fetched, announced)
    assert everything["in-function type history:<uid>"] == 0, everything
    [idle] = cri["idle"]
    assert idle["syncloop/list_containers"] <= idle["syncloop/list_podsandbox"], idle
    for phase in cri.values():
        for counts in phase:
            others = {
                k: v
                for k, v in counts.items()
                if not k.startswith("syncloop/") and k.split("/", 1)[1] in LIFECYCLE
            }
            assert not others, others

    report = (
        f"pods: {PODS}, lifecycle (start + stop) {min(durations):.2f}-{max(durations):.2f} s\n\n"
        f"CRI calls per pod (mean), by service/operation_type:\n\n{table(cri)}\n\n"
        f"Redis commands per pod (mean), by who sent them, command and key:\n\n{table(bus)}\n"
    )
    print(report)
    out = os.environ.get("KLET_OPCOUNTS_OUT")
    if out:
        Path(out).write_text(
            json.dumps(
                {
                    "durations_s": durations,
                    "cri": {p: [dict(c) for c in v] for p, v in cri.items()},
                    "redis": {p: [dict(c) for c in v] for p, v in bus.items()},
                },
                indent=1,
            )
        )

"""Benchmark: how long a standby replica takes to take over when the leader is SIGKILLed.

Run as root with ``make bench-failover`` (``.venv/bin/python bench/failover.py``). It starts
a private DevStack and the whole agent (``tests.harness.node.KletNode``: the five services
as processes) with two static pods, ``victim`` and ``bystander``. Then, one service at a
time, it starts a second replica of that service with its own ``--service-port``, sharing
the node's run directory (as two docker-compose replicas on one host would), and repeats
``FAILOVER_ROUNDS`` times (default 5):

1. wait a random part of the leaders' 5 s renewal period, find the leader from the lease
   key in Redis (``klet:<node>:lease:<service>``, whose value starts with the holder ID
   ``<hostname>:<pid>:<hex>``) and SIGKILL it;
2. poll every 10 ms until the standby holds the lease (*lease*) and until it acts
   (*acts*): its ``/readyz`` answers 200 (syncloop, eviction, image-gc: ready means elected
   and working). pod-source's standby is ready before it leads (it reads and merges the
   sources too), so for it *acts* is when a manifest written at the kill is published to
   the ``desired`` table, which only the leader writes;
3. syncloop only: at the kill the victim's container is also stopped through CRI
   (StopContainer, timeout 0); *death* is when the ``status`` table (what ``/pods``
   serves) shows it terminated or restarted, *restarted* when it is running again;
4. restart the killed replica (it comes back as the standby), and after two PLEG relists
   of the syncloop leader count the restarts the failover caused: a pod that was not
   killed must keep its container ID and its restartCount.

A service whose replicas do not contend for a lease (no lease key while both run) is
reported as "no lease". Prints the median and worst per service and writes
``bench/results/failover-latest.json``; see bench/README.md for the method and figures.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import os
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from klet.bus import Bus, NodeBus  # noqa: E402
from klet.cri import RuntimeClient  # noqa: E402
from klet.cri import labels as L  # noqa: E402
from klet.cri.types import ContainerState  # noqa: E402
from klet.devstack import BUSYBOX_IMAGE, DevStack, ManagedProcess, free_port  # noqa: E402
from klet.model.types import ContainerID  # noqa: E402

from bench import common  # noqa: E402
from bench.run import MANIFEST, cleanup, machine, make_client, summary  # noqa: E402
from tests.harness.node import (  # noqa: E402
    RELISTS,
    SERVICES,
    KletNode,
    container_status,
    fetch,
    sample_value,
)
from tests.harness.pods import running  # noqa: E402
from tests.harness.waiting import TRANSIENT, wait_for  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "failover-latest.json"
POLL_S = 0.010
ROUND_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0
# Leaders renew every third of the 15 s lease TTL. A crash comes at any moment of that
# period, so each kill waits a random part of it: a kill timed by the bench's own steps
# would always fall at the same distance from the last renewal.
RENEW_PERIOD_S = 5.0
NO_LEASE_AFTER_S = 10.0  # both replicas ready and no lease key this long: "no lease"
PODS = ("victim", "bystander")
# status-reporter's other listeners; the second replica needs ports of its own for them.
OTHER_PORTS = {"status-reporter": ("--read-only-port", "--healthz-port", "--port")}


@dataclass
class Replica:
    """One process of the service under test and its private HTTP port."""

    proc: ManagedProcess
    port: int

    def answers(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError:  # 503: not ready
            return False

    def start(self) -> None:
        self.proc.start()
        self.proc.wait_ready(lambda: self.answers("/healthz"), START_TIMEOUT_S, "/healthz")


@dataclass
class Round:
    """Seconds from the leader's SIGKILL; None where not measured."""

    lease: float
    acts: float | None
    death: float | None = None
    restarted: float | None = None
    failover_restarts: int = 0


@dataclass
class Result:
    service: str
    acts_means: str = ""
    no_lease: bool = False
    rounds: list[Round] = field(default_factory=list)
    error: str = ""


def second_replica(node: KletNode, service: str) -> Replica:
    """The first replica's command line with distinct ports: same run dir, same user."""
    argv = list(node.procs[service].argv)
    port = free_port()
    for flag in ("--service-port", *OTHER_PORTS.get(service, ())):
        argv[argv.index(flag) + 1] = str(port if flag == "--service-port" else free_port())
    return Replica(ManagedProcess(f"{service}-b", argv, dir=node.procs[service].dir), port)


def watch(checks: dict[str, Callable[[], bool]], t0: float) -> dict[str, float]:
    """Poll every POLL_S until each check has held once; when each first held, from t0."""
    seen: dict[str, float] = {}
    while len(seen) < len(checks):
        for name, check in checks.items():
            try:
                held = name not in seen and check()
            except TRANSIENT:
                held = False
            if held:
                seen[name] = time.perf_counter() - t0
        if time.perf_counter() - t0 > ROUND_TIMEOUT_S:
            missing = sorted(checks.keys() - seen.keys())
            raise TimeoutError(f"timed out after {ROUND_TIMEOUT_S:.0f}s waiting for {missing}")
        time.sleep(POLL_S)
    return seen


class Failover:
    def __init__(
        self, node: KletNode, manifests: Path, runner: asyncio.Runner, cri: RuntimeClient, bus: Bus
    ) -> None:
        self.node = node
        self.manifests = manifests
        self.runner = runner
        self.cri = cri
        self.bus = bus
        self.extra: list[Replica] = []  # second replicas, for clean-up

    # -- observations ----------------------------------------------------------------

    def holder_pid(self, service: str) -> int | None:
        """The pid in the lease's holder ID, or None when nobody holds it."""
        value = self.runner.run(_get(self.bus, f"lease:{service}"))
        return int(value.split(":")[1]) if value else None

    def published(self, name: str) -> bool:
        full = f"{name}-{self.node.node_name}"
        desired = self.runner.run(NodeBus.of(self.bus, service="syncloop").desired.all())
        return any(r.pod.get("metadata", {}).get("name") == full for r in desired.values())

    def main_status(self, pod: str) -> dict[str, Any]:
        """The status of `pod`'s container as syncloop reported it (the `status` table that
        status-reporter serves as /pods; read here so no status-reporter is needed)."""
        full = f"{pod}-{self.node.node_name}"
        records = self.runner.run(NodeBus.of(self.bus, service="syncloop").status.all()).values()
        status = next(r.status for r in records if r.name == full)
        return container_status({"status": status}, "main")

    def running_container(self, pod: str) -> ContainerID:
        """The pod's one running container, straight from CRI."""
        full = f"{pod}-{self.node.node_name}"
        found = self.runner.run(self.cri.list_containers(label_selector={L.POD_NAME: full}))
        ids = [c.id for c in found if c.state is ContainerState.RUNNING]
        if len(ids) != 1:
            raise LookupError(f"{full}: running containers {ids}")
        return ids[0]

    def baseline(self) -> dict[str, tuple[ContainerID, int]]:
        return {
            p: (self.running_container(p), int(self.main_status(p)["restartCount"])) for p in PODS
        }

    def relisted(self, port: int, count: int) -> None:
        """Wait for `count` more PLEG relists of the syncloop replica on `port`: by then a
        restart the failover caused has happened and is on /pods."""

        def relists() -> float | None:
            return sample_value(fetch(f"http://127.0.0.1:{port}/metrics"), RELISTS)

        start = wait_for(relists, timeout_s=30, what="a syncloop relist")
        wait_for(
            lambda: (relists() or 0) >= start + count,
            timeout_s=30,
            what=f"{count} more syncloop relists",
        )

    # -- one service -----------------------------------------------------------------

    def service(self, service: str, rounds: int) -> Result:
        """`rounds` failovers of `service`; a round that times out ends this service's
        series (recorded in `error`) and the bench goes on with the next service."""
        first = Replica(self.node.procs[service], self.node.ports[service])
        second = second_replica(self.node, service)
        self.extra.append(second)
        pair = (first, second)
        res = Result(service)
        try:
            second.start()
            if not self._leased(service, pair):
                res.no_lease = True
                return res
            for n in range(rounds):
                r = self.round(service, pair, n, res)
                res.rounds.append(r)
                print(
                    f"  round {n + 1}: lease {r.lease:.2f} s, acts "
                    f"{'-' if r.acts is None else f'{r.acts:.2f} s'}"
                    + ("" if r.death is None else f", death reported {r.death:.2f} s")
                    + ("" if r.restarted is None else f", running again {r.restarted:.2f} s")
                    + f", failover restarts {r.failover_restarts}",
                    flush=True,
                )
        except (TimeoutError, AssertionError, RuntimeError, LookupError, OSError) as err:
            res.error = f"{type(err).__name__}: {err}"
            print(f"  {service} FAILED: {res.error}", flush=True)
        finally:
            second.proc.stop()  # SIGTERM: it hands its lease back
            self.extra.remove(second)
            if not first.proc.alive:
                first.start()
            for probe in self.manifests.glob("probe*.yaml"):
                probe.unlink()
        if not res.no_lease:  # the next service's rounds start from one leading replica
            wait_for(
                lambda: self.holder_pid(service) == first.proc.pid,
                timeout_s=ROUND_TIMEOUT_S,
                what=f"{service}'s first replica leading",
            )
        return res

    def _leased(self, service: str, pair: tuple[Replica, Replica]) -> bool:
        """Whether the pair contends for a lease: one of them holds it once both are ready
        (the standby of a leased service is not ready, except pod-source's)."""
        pids = {r.proc.pid for r in pair}
        deadline = time.monotonic() + START_TIMEOUT_S
        ready_since: float | None = None
        while time.monotonic() < deadline:
            holder = self.holder_pid(service)
            if holder in pids:
                return True
            if holder is not None:
                raise RuntimeError(f"{service}: lease held by pid {holder}, not a replica {pids}")
            if ready_since is None and any(_try(r.answers, "/readyz") for r in pair):
                ready_since = time.monotonic()
            if ready_since is not None and time.monotonic() - ready_since > NO_LEASE_AFTER_S:
                return False
            time.sleep(0.1)
        raise TimeoutError(f"{service}: neither replica ready nor leading")

    def round(self, service: str, pair: tuple[Replica, Replica], n: int, res: Result) -> Round:
        holder = self.holder_pid(service)
        leader, standby = pair if pair[0].proc.pid == holder else pair[::-1]
        if leader.proc.pid != holder:
            raise RuntimeError(f"{service}: lease holder pid {holder} is neither replica")
        checks: dict[str, Callable[[], bool]] = {
            "lease": lambda: self.holder_pid(service) == standby.proc.pid
        }
        probe = f"probe{n}"
        if service == "pod-source":
            res.acts_means = "a manifest written at the kill is in the desired table"
            checks["acts"] = lambda: self.published(probe)
        elif not _try(standby.answers, "/readyz"):
            res.acts_means = "the standby's /readyz answers 200"
            checks["acts"] = lambda: standby.answers("/readyz")
        else:
            res.acts_means = "not observed: the standby was ready before it led"
        before = self.baseline()
        victim_rc = before["victim"][1]
        if service == "syncloop":
            checks["death"] = lambda: (
                "terminated" in (s := self.main_status("victim"))["state"]
                or s["restartCount"] > victim_rc
            )
            checks["restarted"] = lambda: (
                (s := self.main_status("victim"))["restartCount"] > victim_rc
                and "running" in s["state"]
                and bool(s["ready"])
            )

        time.sleep(random.uniform(0, RENEW_PERIOD_S))
        t0 = time.perf_counter()
        leader.proc.kill()
        if service == "syncloop":
            self.runner.run(self.cri.stop_container(before["victim"][0], timeout_s=0))
        if service == "pod-source":
            (self.manifests / f"{probe}.yaml").write_text(
                MANIFEST.format(name=probe, image=BUSYBOX_IMAGE)
            )
        seen = watch(checks, t0)

        leader.start()  # back as the standby, as its supervisor would restart it
        if service == "pod-source":
            (self.manifests / f"{probe}.yaml").unlink()
            wait_for(
                lambda: not self.published(probe) and not self._sandboxes(probe),
                timeout_s=ROUND_TIMEOUT_S,
                what=f"{probe} removed",
            )
        syncloop = standby.port if service == "syncloop" else self.node.ports["syncloop"]
        self.relisted(syncloop, 2)
        if "death" in seen:  # running again implies reported: a poll may see both at once
            seen["death"] = min(seen["death"], seen["restarted"])
        return Round(
            lease=seen["lease"],
            acts=seen.get("acts"),
            death=seen.get("death"),
            restarted=seen.get("restarted"),
            failover_restarts=self.restarts_since(
                before, killed="victim" if service == "syncloop" else None
            ),
        )

    def _sandboxes(self, name: str) -> list[str]:
        full = f"{name}-{self.node.node_name}"
        return [
            s.id
            for s in self.runner.run(self.cri.list_pod_sandboxes(label_selector={L.POD_NAME: full}))
        ]

    def restarts_since(
        self, before: dict[str, tuple[ContainerID, int]], *, killed: str | None
    ) -> int:
        """Container restarts beyond the one of the container this round stopped."""
        restarts = 0
        for pod, (cid, rc) in before.items():
            now_cid = self.running_container(pod)
            now_rc = int(self.main_status(pod)["restartCount"])
            expected = 1 if pod == killed else 0
            restarts += max(now_rc - rc - expected, int(now_cid != cid and pod != killed))
        return restarts


async def _get(bus: Bus, name: str) -> str | None:
    value = await bus.client.get(bus.key(name))
    return None if value is None else str(value)


def _try(check: Callable[[str], bool], arg: str) -> bool:
    try:
        return check(arg)
    except TRANSIENT:
        return False


# -- report ------------------------------------------------------------------------------


def summarize(res: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        "no_lease": res.no_lease,
        "acts_means": res.acts_means,
        "error": res.error,
    }
    for key in ("lease", "acts", "death", "restarted"):
        values = [v for r in res.rounds if (v := getattr(r, key)) is not None]
        if values:
            out[key] = summary(values)
    out["failover_restarts"] = sum(r.failover_restarts for r in res.rounds)
    out["rounds"] = [vars(r) for r in res.rounds]
    return out


def cell(s: dict[str, Any] | None) -> str:
    if not s:
        return f"{'-':>8}{'-':>8}"
    return f"{s['median']:>8.2f}{s['max']:>8.2f}"


def report(res: dict[str, Any]) -> str:
    lines = [
        "",
        f"klet failover bench  {res['date']}  nproc={res['machine']['nproc']}  "
        f"load avg before={res['load_before']}  after={res['load_after']}",
        f"commit {res['machine']['commit']}"
        f"{' (dirty worktree)' if res['machine']['worktree_dirty'] else ''}  "
        f"rounds per service {res['rounds']}  poll {POLL_S * 1000:.0f} ms",
        "",
        f"{'seconds from SIGKILL of the leader':<36}{'n':>3}{'median':>8}{'worst':>8}"
        f"  failover restarts",
    ]
    for service, s in res["services"].items():
        if s["no_lease"]:
            lines.append(f"{service:<36}  no lease: its replicas do not contend (both act)")
            continue
        n = len(s["rounds"])
        lines.append(
            f"{service + ': standby holds the lease':<36}{n:>3}{cell(s.get('lease'))}"
            f"  {s['failover_restarts']}"
        )
        lines.append(f"{'  ... and acts':<36}{n:>3}{cell(s.get('acts'))}  ({s['acts_means']})")
        if "death" in s:
            lines.append(f"{'  ... container death reported':<36}{n:>3}{cell(s['death'])}")
            lines.append(f"{'  ... container running again':<36}{n:>3}{cell(s['restarted'])}")
        if s["error"]:
            lines.append(f"{'  FAILED':<36}  {s['error']}")
    lines += ["", f"total run time {res['run_seconds']:.0f} s"]
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--rounds",
        type=int,
        default=int(os.environ.get("FAILOVER_ROUNDS", "5")),
        help="failovers per service (default $FAILOVER_ROUNDS or 5)",
    )
    p.add_argument(
        "--services",
        nargs="+",
        choices=SERVICES,
        default=list(SERVICES),
        help="services to fail over (default all)",
    )
    common.add_keep_and_output(p, RESULTS, keep_help="keep the run dir (service logs)")
    return p.parse_args(argv)


async def admin_bus(node: KletNode) -> Bus:
    return node.bus()  # made in the runner's loop, which its connections then belong to


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if (code := common.begin(root_for="it starts containerd")) is not None:
        return code
    began = time.perf_counter()
    run_id = uuid.uuid4().hex[:8]
    node_name = f"failover{run_id}"
    run_dir = Path(tempfile.mkdtemp(prefix="klet-", dir="/tmp"))
    stack = DevStack(run_dir)
    runner = asyncio.Runner()
    cri: RuntimeClient | None = None
    node: KletNode | None = None
    bench: Failover | None = None
    load_before = common.load()
    results: dict[str, Result] = {}
    try:
        print(f"bench: devstack in {run_dir} ...", flush=True)
        stack.start()
        cri = runner.run(make_client(stack.runtime_endpoint))
        manifests = run_dir / "manifests"
        manifests.mkdir()
        for name in PODS:
            (manifests / f"{name}.yaml").write_text(MANIFEST.format(name=name, image=BUSYBOX_IMAGE))
        node = KletNode(stack, run_dir / "node", node_name=node_name, manifest_dir=manifests)
        print(f"bench: klet node {node_name} starting ...", flush=True)
        node.start()
        for name in PODS:
            wait_for(
                functools.partial(running, node, name),
                timeout_s=ROUND_TIMEOUT_S,
                what=f"{name} Running",
            )
        bench = Failover(node, manifests, runner, cri, runner.run(admin_bus(node)))
        for service in args.services:
            print(f"bench: {service}, {args.rounds} failovers ...", flush=True)
            results[service] = bench.service(service, args.rounds)
    finally:
        with common.cleaning_up():
            if bench is not None:
                for replica in bench.extra:
                    replica.proc.stop()
                runner.run(bench.bus.close())
            cleanup(stack, runner, cri, node, run_id, node_name, run_dir, args.keep)

    res = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "rounds": args.rounds,
        "poll_interval_s": POLL_S,
        "machine": machine(),
        "load_before": load_before,
        "load_after": common.load(),
        "services": {s: summarize(r) for s, r in results.items()},
        "run_seconds": time.perf_counter() - began,
        "units": "seconds",
    }
    common.write_results(args.output, res)
    print(report(res))
    print(f"results: {args.output}")
    return 1 if any(r.error for r in results.values()) else 0


if __name__ == "__main__":
    common.entry(main)

"""Benchmark: what klet adds on top of the raw CRI floor of the same containerd.

Run as root with ``make bench`` (``.venv/bin/python bench/run.py``). It starts a private
DevStack (Redis, registry, containerd) in a short temp dir under /tmp and measures:

1. CRI floor, sequential: N pods straight through ``klet.cri.RuntimeClient``
   (RunPodSandbox + PodSandboxStatus, CreateContainer + StartContainer of an image
   already present; then StopPodSandbox + RemovePodSandbox).
2. CRI floor, burst: M such pod starts issued concurrently, then again with at most
   `--floor-parallel` sandbox creations in flight (syncloop's bound, default 8).
3. klet, sequential: a KletNode (the three services as processes); for each of N pods a
   one-container manifest is written, ``/pods`` is polled every 20 ms until the pod is
   Running with all containers ready; then the manifest is removed and CRI is polled
   every 20 ms until its sandbox is gone.
4. klet, burst: M manifests written at once, time until all are Running (and then
   removed at once, time until all sandboxes are gone), `--burst-rounds` times; the
   CPU-seconds each service process (and Redis) spent until all were Running, from
   /proc/<pid>/stat.

Prints a table (median, p90, min, max, klet/CRI ratio of medians) and writes
``bench/results/latest.json``. Everything started is cleaned up on error or Ctrl-C.
See bench/README.md for how to read the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from klet.cri import CRISettings, RuntimeClient  # noqa: E402
from klet.cri import labels as L  # noqa: E402
from klet.cri.errors import CRIError  # noqa: E402
from klet.cri.types import ContainerConfig, SandboxConfig  # noqa: E402
from klet.devstack import BUSYBOX_IMAGE, DevStack  # noqa: E402

from bench import common  # noqa: E402
from tests.harness.node import KletNode  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "latest.json"
POLL_S = 0.020
POD_TIMEOUT_S = 120.0
BENCH_LABEL = "klet.bench/run"  # on the CRI-floor sandboxes, so clean-up finds them

MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - name: main
      image: {image}
      command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
"""
# The same process for the CRI floor: PID 1 of its own PID namespace ignores SIGTERM
# unless it traps it, so it traps it.
COMMAND = ("sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait")

log = logging.getLogger("bench")


# -- statistics ------------------------------------------------------------------------


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """median, p90 (linear interpolation between closest ranks), min, max; seconds."""
    xs = sorted(samples)
    if not xs:
        return {"n": 0}
    pos = 0.9 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    p90 = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p90": p90,
        "min": xs[0],
        "max": xs[-1],
        "samples": list(samples),
    }


# -- the CRI floor ---------------------------------------------------------------------


class Floor:
    """Pods made directly through RuntimeClient, as little on top of CRI as possible."""

    def __init__(self, cri: RuntimeClient, run_id: str, logs_dir: Path) -> None:
        self.cri = cri
        self.run_id = run_id
        self.logs_dir = logs_dir

    def _configs(self, name: str) -> tuple[SandboxConfig, ContainerConfig]:
        uid = str(uuid.uuid4())
        log_dir = self.logs_dir / uid
        (log_dir / "main").mkdir(parents=True, exist_ok=True)
        sandbox = SandboxConfig(
            name=name,
            namespace="bench",
            uid=uid,
            attempt=0,
            hostname=name,
            log_directory=str(log_dir),
            labels={BENCH_LABEL: self.run_id},
        )
        container = ContainerConfig(
            name="main",
            attempt=0,
            image=BUSYBOX_IMAGE,
            command=COMMAND,
            log_path="main/0.log",
            labels={BENCH_LABEL: self.run_id},
        )
        return sandbox, container

    async def start_pod(
        self, name: str, gate: asyncio.Semaphore | None = None
    ) -> tuple[str, dict[str, float]]:
        """Start one pod; with `gate`, its sandbox is created while holding it (as
        syncloop bounds the sandbox creations in flight)."""
        sandbox, container = self._configs(name)
        t0 = time.perf_counter()
        async with gate if gate is not None else contextlib.nullcontext():
            sid = await self.cri.run_pod_sandbox(sandbox)
            await self.cri.pod_sandbox_status(sid)
        t1 = time.perf_counter()
        cid = await self.cri.create_container(sid, container, sandbox)
        await self.cri.start_container(cid)
        t2 = time.perf_counter()
        return sid, {"start": t2 - t0, "sandbox": t1 - t0, "container": t2 - t1}

    async def teardown(self, sid: str) -> float:
        t0 = time.perf_counter()
        await self.cri.stop_pod_sandbox(sid)  # type: ignore[arg-type]
        await self.cri.remove_pod_sandbox(sid)  # type: ignore[arg-type]
        return time.perf_counter() - t0

    async def sequential(self, n: int, warmup: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"start": [], "sandbox": [], "container": [], "teardown": []}
        for i in range(warmup + n):
            sid, t = await self.start_pod(f"floor-{i}-{self.run_id}")
            down = await self.teardown(sid)
            if i >= warmup:
                for k, v in t.items():
                    out[k].append(v)
                out["teardown"].append(down)
        return out

    async def burst(self, m: int, parallel: int = 0) -> dict[str, Any]:
        """M pod starts issued at once; `parallel` > 0 bounds the sandbox creations in
        flight (0: all at once)."""
        gate = asyncio.Semaphore(parallel) if parallel > 0 else None
        t0 = time.perf_counter()

        async def one(j: int) -> tuple[str, float]:
            sid, _ = await self.start_pod(f"floorburst{parallel}-{j}-{self.run_id}", gate)
            return sid, time.perf_counter() - t0

        done = await asyncio.gather(*(one(j) for j in range(m)))
        all_running = time.perf_counter() - t0
        t1 = time.perf_counter()
        await asyncio.gather(*(self.teardown(sid) for sid, _ in done))
        return {
            "per_pod": [t for _, t in done],
            "all_running": all_running,
            "all_removed": time.perf_counter() - t1,
        }


# -- klet --------------------------------------------------------------------------------


def pod_ready(pod: dict[str, Any] | None) -> bool:
    if not pod:
        return False
    status = pod.get("status", {})
    cs = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(cs) and all(c.get("ready") for c in cs)


def poll(check: Callable[[], bool], what: str, timeout_s: float = POD_TIMEOUT_S) -> None:
    deadline = time.perf_counter() + timeout_s
    while True:
        try:
            if check():
                return
        except OSError as err:  # /pods briefly unreachable: keep polling
            log.debug("poll %s: %s", what, err)
        if time.perf_counter() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(POLL_S)


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process from /proc/<pid>/stat, seconds (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class KletBench:
    def __init__(
        self, node: KletNode, manifests: Path, runner: asyncio.Runner, cri: RuntimeClient
    ) -> None:
        self.node = node
        self.manifests = manifests
        self.runner = runner
        self.cri = cri

    def full_name(self, name: str) -> str:
        return f"{name}-{self.node.node_name}"

    def sandboxes(self, names: set[str]) -> list[str]:
        items = self.runner.run(self.cri.list_pod_sandboxes())
        return [s.id for s in items if s.labels.get(L.POD_NAME) in names]

    def is_running(self, full: str) -> bool:
        return pod_ready(self.node.pods().get(full))

    def is_gone(self, full: str) -> bool:
        return not self.sandboxes({full})

    def write(self, name: str) -> Path:
        path = self.manifests / f"{name}.yaml"
        path.write_text(MANIFEST.format(name=name, image=BUSYBOX_IMAGE))
        return path

    def sequential(self, n: int, warmup: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"start": [], "teardown": []}
        for i in range(warmup + n):
            name = f"seq{i}"
            full = self.full_name(name)
            t0 = time.perf_counter()
            path = self.write(name)
            poll(functools.partial(self.is_running, full), f"{full} Running")
            up = time.perf_counter() - t0
            t1 = time.perf_counter()
            path.unlink()
            poll(functools.partial(self.is_gone, full), f"{full} sandbox removed")
            down = time.perf_counter() - t1
            if i >= warmup:
                out["start"].append(up)
                out["teardown"].append(down)
            print(
                f"  klet pod {i + 1 - warmup if i >= warmup else 'warm-up'}: "
                f"running {up * 1000:.0f} ms, removed {down * 1000:.0f} ms",
                flush=True,
            )
        return out

    def pids(self) -> dict[str, int | None]:
        """The service processes and the node's Redis, by name."""
        out = {name: proc.pid for name, proc in self.node.procs.items()}
        out["redis"] = self.node.redis.pid
        return out

    def burst(self, m: int, round_no: int = 0) -> dict[str, Any]:
        names = [f"burst{round_no}-{j}" for j in range(m)]
        fulls = {self.full_name(n) for n in names}
        running: dict[str, float] = {}
        pids = self.pids()
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        paths = [self.write(n) for n in names]

        def all_running() -> bool:
            pods = self.node.pods()
            now = time.perf_counter() - t0
            for f in fulls - running.keys():
                if pod_ready(pods.get(f)):
                    running[f] = now
            return len(running) == len(fulls)

        poll(all_running, f"{m} burst pods Running")
        total = time.perf_counter() - t0
        cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
        t1 = time.perf_counter()
        for p in paths:
            p.unlink()
        poll(lambda: not self.sandboxes(fulls), f"{m} burst sandboxes removed")
        return {
            "per_pod": sorted(running.values()),
            "all_running": total,
            "all_removed": time.perf_counter() - t1,
            "cpu_until_running": cpu,
        }


# -- clean-up ----------------------------------------------------------------------------


async def remove_sandboxes(cri: RuntimeClient, run_id: str, node_name: str | None) -> int:
    """Stop and remove every sandbox of this run (the floor's and the node's).

    Each sandbox gets its own attempts, so one that an interruption left half torn down
    does not keep the others alive; returns how many could not be removed.
    """
    failed = 0
    for s in await cri.list_pod_sandboxes():
        ours = s.labels.get(BENCH_LABEL) == run_id or (
            node_name is not None and s.labels.get(L.POD_NAME, "").endswith(f"-{node_name}")
        )
        if not ours:
            continue
        for attempt in range(3):
            try:
                await cri.stop_pod_sandbox(s.id)
                await cri.remove_pod_sandbox(s.id)
                break
            except CRIError as err:
                if attempt == 2:
                    print(f"bench: could not remove sandbox {s.id[:12]}: {err}", file=sys.stderr)
                    failed += 1
                else:
                    await asyncio.sleep(0.5)
    return failed


async def make_client(endpoint: str) -> RuntimeClient:
    # Created inside the runner's loop so its grpc.aio channel belongs to that loop.
    return RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=60))


# -- report ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "worktree_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def fmt_row(label: str, s: dict[str, Any], ratio: float | None = None) -> str:
    if not s.get("n"):
        return f"{label:<44} (no samples)"
    cells = "".join(f"{s[k] * 1000:>9.0f}" for k in ("median", "p90", "min", "max"))
    r = f"{ratio:>8.2f}x" if ratio is not None else f"{'':>9}"
    return f"{label:<44}{s['n']:>4}{cells}{r}"


def ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if a.get("n") and b.get("n") and b["median"] > 0:
        return float(a["median"] / b["median"])
    return None


def report(res: dict[str, Any]) -> str:
    m = res["measurements"]
    par = res.get("floor_parallel", 0)
    lines = [
        "",
        f"klet bench  {res['date']}  nproc={res['machine']['nproc']}  "
        f"load avg before={res['load_before']}  after={res['load_after']}",
        f"containerd {res['runtime_version']}  commit {res['machine']['commit']}"
        f"{' (dirty worktree)' if res['machine']['worktree_dirty'] else ''}",
        "pod-source: --file-check-frequency 1s; manifest changes are picked up by inotify "
        "(inotify-driven, not the 1 s poll)",
        "",
        f"{'measurement (ms)':<44}{'n':>4}{'median':>9}{'p90':>9}{'min':>9}{'max':>9}"
        f"{'klet/CRI':>9}",
    ]
    rows = [
        ("CRI floor: start (sandbox + container)", "cri_start", None),
        ("  of which RunPodSandbox + Status", "cri_sandbox", None),
        ("  of which Create + StartContainer", "cri_container", None),
        ("CRI floor: Stop + RemovePodSandbox", "cri_teardown", None),
        ("klet: manifest written -> Running+ready", "klet_start", "cri_start"),
        ("klet: manifest removed -> sandbox gone", "klet_teardown", "cri_teardown"),
        (f"CRI floor burst x{res['burst']}: per-pod started", "cri_burst_per_pod", None),
        (f"klet burst x{res['burst']}: per-pod Running", "klet_burst_per_pod", "cri_burst_per_pod"),
        (
            f"CRI floor burst x{res['burst']} ({par} sbx): per-pod",
            "cri_burst_bounded_per_pod",
            None,
        ),
    ]
    for label, key, base in rows:
        if key in m:
            r = ratio(m[key], m[base]) if base and base in m else None
            lines.append(fmt_row(label, m[key], r))
    for label, key, base in (
        (f"CRI floor burst x{res['burst']}: all started", "cri_burst_all", None),
        (f"klet burst x{res['burst']}: all Running", "klet_burst_all", "cri_burst_all"),
        (
            f"CRI floor burst x{res['burst']} ({par} sbx): all started",
            "cri_burst_bounded_all",
            None,
        ),
        ("  klet all Running / this floor", "klet_burst_all", "cri_burst_bounded_all"),
        (f"CRI floor burst x{res['burst']}: all removed", "cri_burst_removed", None),
        (
            f"klet burst x{res['burst']}: all sandboxes gone",
            "klet_burst_removed",
            "cri_burst_removed",
        ),
    ):
        if key in m:
            r = m[key] / m[base] if base and m.get(base) else None
            rtxt = f"{r:>8.2f}x" if r is not None else ""
            lines.append(f"{label:<44}{1:>4}{m[key] * 1000:>9.0f}{'':>27}{rtxt}")
    if cpu := m.get("klet_burst_cpu"):
        lines.append(
            f"klet burst x{res['burst']}: CPU-s until all Running (median of "
            f"{res.get('burst_rounds', 1)}): "
            + ", ".join(f"{name} {v:.2f}" for name, v in cpu.items())
            + f"; all {sum(cpu.values()):.2f}"
        )
    lines += [
        "",
        "manifests set terminationGracePeriodSeconds: 0 (klet clamps it to 2 s); the "
        "container is PID 1 of its own PID namespace (as upstream), so it traps SIGTERM "
        "and exits: the grace period never elapses in klet's teardown.",
        f"total run time {res['run_seconds']:.1f} s "
        f"(devstack start {res['devstack_seconds']:.1f} s)",
    ]
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--pods", type=int, default=10, help="pods measured one at a time (default 10)")
    p.add_argument("--burst", type=int, default=10, help="pods written at once (default 10)")
    p.add_argument(
        "--floor-parallel",
        type=int,
        default=8,
        help="also run the CRI-floor burst with at most this many sandbox "
        "creations in flight, as syncloop does (default 8; 0 skips it)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed pods before each sequential series (default 1)",
    )
    p.add_argument(
        "--burst-rounds",
        type=int,
        default=1,
        help="klet bursts run one after the other (default 1); the table gives their "
        "medians, the JSON every round",
    )
    common.add_keep_and_output(p, RESULTS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if (code := common.begin(root_for="it starts containerd")) is not None:
        return code

    began = time.perf_counter()
    run_id = uuid.uuid4().hex[:8]
    node_name = f"bench{run_id}"
    run_dir = Path(tempfile.mkdtemp(prefix="klet-", dir="/tmp"))
    stack = DevStack(run_dir)
    runner = asyncio.Runner()
    cri: RuntimeClient | None = None
    node: KletNode | None = None
    load_before = common.load()
    m: dict[str, Any] = {}
    res: dict[str, Any] = {}
    try:
        print(f"bench: devstack in {run_dir} ...", flush=True)
        stack.start()
        cri = runner.run(make_client(stack.runtime_endpoint))
        version = runner.run(cri.version())
        runner.run(cri.pull_image(BUSYBOX_IMAGE))  # "image already present" for both sides

        floor = Floor(cri, run_id, run_dir / "floor-logs")
        print(f"bench: CRI floor, {args.pods} pods sequentially ...", flush=True)
        f = runner.run(floor.sequential(args.pods, args.warmup))
        m["cri_start"], m["cri_sandbox"] = summary(f["start"]), summary(f["sandbox"])
        m["cri_container"], m["cri_teardown"] = summary(f["container"]), summary(f["teardown"])
        if args.burst > 0:
            print(f"bench: CRI floor, burst of {args.burst} ...", flush=True)
            fb = runner.run(floor.burst(args.burst))
            m["cri_burst_per_pod"] = summary(fb["per_pod"])
            m["cri_burst_all"], m["cri_burst_removed"] = fb["all_running"], fb["all_removed"]
            if args.floor_parallel > 0:
                print(
                    f"bench: CRI floor, burst of {args.burst}, {args.floor_parallel} sandboxes "
                    "at a time ...",
                    flush=True,
                )
                fp = runner.run(floor.burst(args.burst, args.floor_parallel))
                m["cri_burst_bounded_per_pod"] = summary(fp["per_pod"])
                m["cri_burst_bounded_all"] = fp["all_running"]

        manifests = run_dir / "manifests"
        manifests.mkdir()
        node = KletNode(
            stack,
            run_dir / "node",
            node_name=node_name,
            manifest_dir=manifests,
            extra_flags=["--evented-pleg-relist-period", "20s"],
        )  # the default
        print(f"bench: klet node {node_name} starting ...", flush=True)
        node.start()
        kb = KletBench(node, manifests, runner, cri)
        print(f"bench: klet, {args.pods} pods one at a time ...", flush=True)
        k = kb.sequential(args.pods, args.warmup)
        m["klet_start"], m["klet_teardown"] = summary(k["start"]), summary(k["teardown"])
        if args.burst > 0:
            rounds = []
            for r in range(max(1, args.burst_rounds)):
                print(f"bench: klet, burst of {args.burst} (round {r + 1}) ...", flush=True)
                rounds.append(kb.burst(args.burst, r))
            m["klet_burst_rounds"] = rounds
            m["klet_burst_per_pod"] = summary([t for b in rounds for t in b["per_pod"]])
            m["klet_burst_all"] = statistics.median(b["all_running"] for b in rounds)
            m["klet_burst_removed"] = statistics.median(b["all_removed"] for b in rounds)
            m["klet_burst_cpu"] = {
                name: statistics.median(b["cpu_until_running"][name] for b in rounds)
                for name in rounds[0]["cpu_until_running"]
            }

        res = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "pods": args.pods,
            "burst": args.burst,
            "burst_rounds": max(1, args.burst_rounds),
            "floor_parallel": args.floor_parallel,
            "warmup": args.warmup,
            "poll_interval_s": POLL_S,
            "file_check_frequency": "1s (inotify-driven)",
            "runtime_version": f"{version.runtime_name} {version.runtime_version}",
            "machine": machine(),
            "load_before": load_before,
            "load_after": common.load(),
            "devstack_seconds": stack.start_seconds or 0.0,
            "measurements": m,
            "ratios": {
                "start": ratio(m["klet_start"], m["cri_start"]),
                "teardown": ratio(m["klet_teardown"], m["cri_teardown"]),
                "burst_all_running": (
                    m["klet_burst_all"] / m["cri_burst_all"] if args.burst > 0 else None
                ),
            },
            "units": "seconds",
        }
    finally:
        # A second Ctrl-C must not leave containerd and sandboxes behind.
        with common.cleaning_up():
            cleanup(stack, runner, cri, node, run_id, node_name, run_dir, args.keep)

    res["run_seconds"] = time.perf_counter() - began
    common.write_results(args.output, res)
    print(report(res))
    print(f"results: {args.output}")
    return 0


def cleanup(
    stack: DevStack,
    runner: asyncio.Runner,
    cri: RuntimeClient | None,
    node: KletNode | None,
    run_id: str,
    node_name: str,
    run_dir: Path,
    keep: bool,
) -> None:
    """Every step is attempted even if an earlier one fails."""
    steps: list[common.Step] = []
    if node is not None:
        steps.append(("stop klet node", node.stop))
    if cri is not None and stack.containerd is not None:
        steps.append(
            ("remove sandboxes", lambda: runner.run(remove_sandboxes(cri, run_id, node_name)))
        )
        steps.append(("close CRI client", lambda: runner.run(cri.close())))
    steps.append(("close event loop", runner.close))
    steps.append(("stop devstack", stack.stop))
    common.run_steps(steps, run_dir=run_dir, keep=keep)


if __name__ == "__main__":
    common.entry(main)

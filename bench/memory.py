"""Benchmark: klet's idle memory with 110 pods, per process, standalone or in a cluster.

Run as root with ``make bench-memory`` (both modes) or ``.venv/bin/python bench/memory.py
--mode standalone|cluster``. It starts a private DevStack (registry with the test images,
containerd) in a short temp dir under /tmp and ``klet up`` on it, as an operator runs the
agent (the five services, and klet up's own Redis, each a child process of klet up):

- ``standalone``: no kubeconfig; ``--pods`` (110) static pods written into the manifest
  directory once klet serves ``/pods``;
- ``cluster``: a real etcd + kube-apiserver (``klet.testbed.cluster.ControlPlane``, the
  binaries of ``make cluster-binaries``), klet joined to it as a node
  (``ControlPlane.node_flags``: kubeconfig, serving certificate, client CA), so the
  services that talk to the apiserver load the kubernetes client; once the Node is
  Ready, ``--pods`` pods bound to it by ``spec.nodeName`` are created through the
  apiserver (namespace ``default``) and the wait ends when the apiserver shows them all
  Running and ready.

Both modes run the pod of ``bench/run.py`` (one busybox container sleeping). Once every
pod is Running and ready in ``/pods`` the node idles ``--idle-s`` (60) seconds, then the
RSS and PSS of every process under klet up (``/proc/<pid>/smaps_rollup``) are read
``--samples`` (5) times, ``--interval-s`` (10) seconds apart. Each process is named by
what it runs (pod-source, syncloop, status-reporter, eviction, image-gc, klet up,
redis); the table gives each one's median and the median of the per-sample totals.
containerd, the shims, the pods and the control plane count for neither mode.

Why ``klet up`` and not the test harness's KletNode (``tests/harness/clusternode.py``): the
harness runs each service with test settings (``-v 4``, a 1 s relist) and without klet up,
while issue 25's figure counts what an operator runs, klet up and its Redis included.

Writes ``bench/results/memory-<mode>.json`` (every sample, the machine, the load).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from klet.cli.up import START_ORDER  # noqa: E402
from klet.devstack import BUSYBOX_IMAGE, DevStack, free_port  # noqa: E402
from klet.devstack.containerd import unmount_under  # noqa: E402
from klet.devstack.procs import read_cmdline  # noqa: E402
from klet.testbed.cluster import ControlPlane  # noqa: E402

from bench import common  # noqa: E402
from bench.compare import KletAgent, Workloads, memory_mb, process_tree, wait  # noqa: E402
from bench.run import MANIFEST, machine, pod_ready  # noqa: E402
from tests.harness.clusternode import wait_node_ready  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
CLUSTER_BUILD = ROOT / "tools" / "cluster" / "build.sh"
NAMESPACE = "default"
RUNNING_TIMEOUT_S = 600.0
POLL_S = 1.0
# Processes by the module they run (``python -m klet.<service>``).
SERVICE_MODULES = {f"klet.{s.replace('-', '_')}": s for s in START_ORDER}
ORDER = (*START_ORDER, "klet up", "redis")

Sample = dict[str, tuple[float, float]]  # process name -> (RSS, PSS) in MB


# -- pure helpers ---------------------------------------------------------------------------


def process_name(argv: Sequence[str], comm: str, *, is_root: bool) -> str:
    """What a process under klet up is: a service, klet up itself, redis, or its ``comm``
    (``comm`` because redis-server rewrites its command line to its address)."""
    if is_root:
        return "klet up"
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1] in SERVICE_MODULES:
            return SERVICE_MODULES[argv[i + 1]]
    return "redis" if comm == "redis-server" else comm or "?"


def summarize(samples: Sequence[Sample]) -> dict[str, tuple[float, float]]:
    """Per process the median RSS and PSS over the samples, and ``total``: the median of
    the per-sample sums (not the sum of the medians). Processes in ``ORDER`` first."""
    names = {n for s in samples for n in s}
    ordered = [n for n in ORDER if n in names] + sorted(names - set(ORDER))
    out = {
        n: (
            statistics.median(s[n][0] for s in samples if n in s),
            statistics.median(s[n][1] for s in samples if n in s),
        )
        for n in ordered
    }
    out["total"] = (
        statistics.median(sum(v[0] for v in s.values()) for s in samples),
        statistics.median(sum(v[1] for v in s.values()) for s in samples),
    )
    return out


def markdown_table(summary: Mapping[str, tuple[float, float]]) -> str:
    lines = ["| process | RSS (MB) | PSS (MB) |", "|---|---|---|"]
    for name, (rss, pss) in summary.items():
        label = "**all processes**" if name == "total" else name
        lines.append(f"| {label} | {rss:.0f} | {pss:.0f} |")
    return "\n".join(lines)


# -- /proc ----------------------------------------------------------------------------------


def sample(root: int) -> Sample:
    """RSS and PSS of every process under ``root``, by name (same names summed)."""
    out: dict[str, tuple[float, float]] = {}
    for pid in process_tree(root):
        argv = read_cmdline(pid)
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:  # gone meanwhile
            continue
        if argv is None:  # gone meanwhile, or a zombie
            continue
        name = process_name(argv, comm, is_root=pid == root)
        rss, pss = memory_mb([pid])
        before = out.get(name, (0.0, 0.0))
        out[name] = (before[0] + rss, before[1] + pss)
    return out


# -- the agent and the pods -------------------------------------------------------------------


class MemoryAgent(KletAgent):
    """bench/compare's ``klet up`` with its state, logs and ports private to the run, plus
    ``extra`` flags (a cluster's node flags)."""

    def __init__(self, dir: Path, node_name: str, endpoint: str, extra: Sequence[str]) -> None:
        super().__init__(dir, node_name, endpoint)
        self.extra = list(extra)

    def argv(self) -> list[str]:
        return [
            *super().argv(),
            "--root-dir",
            str(self.dir / "root"),
            "--pod-logs-dir",
            str(self.dir / "pod-logs"),
            "--cert-dir",
            str(self.dir / "pki"),
            "--healthz-port",
            str(free_port()),
            "--port",
            str(free_port()),
            *self.extra,
        ]


def api_pod(name: str, node: str) -> dict[str, Any]:
    """bench/run.py's pod, bound to ``node`` through the apiserver."""
    pod: dict[str, Any] = yaml.safe_load(MANIFEST.format(name=name, image=BUSYBOX_IMAGE))
    pod["metadata"]["namespace"] = NAMESPACE
    pod["spec"]["nodeName"] = node
    return pod


def api_ready(cp: ControlPlane, node: str) -> int:
    """How many pods bound to ``node`` the apiserver shows Running and ready."""
    res = cp.kubectl(
        "get", "pods", "-n", NAMESPACE, f"--field-selector=spec.nodeName={node}", "-o", "json"
    )
    if res.returncode != 0:
        return 0
    return sum(1 for p in json.loads(res.stdout)["items"] if pod_ready(p))


def control_plane_bin() -> Path:
    """The control plane's bin dir (tools/cluster/build.sh: a no-op when cached)."""
    out = subprocess.run(
        ["bash", str(CLUSTER_BUILD)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def version_of(binary: Path) -> str:
    res = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return res.stdout.strip() or "?"


# -- the run ----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--mode",
        choices=("standalone", "cluster"),
        default="cluster",
        help="static pods without a kubeconfig, or apiserver pods (default cluster)",
    )
    p.add_argument("--pods", type=int, default=110, help="pods on the node (default 110)")
    p.add_argument(
        "--idle-s",
        type=float,
        default=60.0,
        help="seconds idle after all pods are Running, before sampling (default 60)",
    )
    p.add_argument("--samples", type=int, default=5, help="memory readings (default 5)")
    p.add_argument(
        "--interval-s", type=float, default=10.0, help="seconds between readings (default 10)"
    )
    common.add_keep_and_output(
        p,
        RESULTS_DIR / "memory-MODE.json",
        keep_help="keep the run dir (klet's log, the control plane's)",
    )
    args = p.parse_args(argv)
    if args.output == RESULTS_DIR / "memory-MODE.json":
        args.output = RESULTS_DIR / f"memory-{args.mode}.json"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if (code := common.begin(root_for="it starts containerd")) is not None:
        return code
    began = time.perf_counter()
    cluster = args.mode == "cluster"
    bin_dir = control_plane_bin() if cluster else None
    run_dir = Path(tempfile.mkdtemp(prefix="kmem-", dir="/tmp"))
    node = f"mem{uuid.uuid4().hex[:6]}"
    stack = DevStack(run_dir / "s")
    cp = ControlPlane(run_dir / "cp", bin_dir) if bin_dir is not None else None
    agent: MemoryAgent | None = None
    runner = asyncio.Runner()
    w = Workloads(runner)
    load_before = common.load()
    # The tree the services import at start; other engineers may commit during the run.
    at_start = machine()
    samples: list[Sample] = []
    timings: dict[str, float] = {}
    try:
        print(
            f"bench: {args.mode}: devstack{' and control plane' if cp else ''} in {run_dir}",
            flush=True,
        )
        stack.start()
        extra: list[str] = []
        if cp is not None:
            cp.start()
            extra = cp.node_flags(node)
        a = agent = MemoryAgent(run_dir / "klet", node, stack.runtime_endpoint, extra)
        a.start()
        names = [f"mem{j}" for j in range(args.pods)]
        t0 = time.perf_counter()
        if cp is not None:
            wait_node_ready(cp, node)
            cp.apply([api_pod(n, node) for n in names], timeout_s=120)
            plane = cp
            wait(
                lambda: api_ready(plane, node) == len(names),
                f"{len(names)} pods Running in the apiserver",
                poll_s=POLL_S,
                timeout_s=RUNNING_TIMEOUT_S,
            )
            fulls = names
        else:
            w.write(a, names)
            fulls = [a.full(n) for n in names]
        wait(
            lambda: all(pod_ready(p) for p in map(a.pods().get, fulls)),
            f"{len(names)} pods Running in /pods",
            poll_s=POLL_S,
            timeout_s=RUNNING_TIMEOUT_S,
        )
        timings["all_running_s"] = time.perf_counter() - t0
        print(
            f"bench: {len(names)} pods Running after {timings['all_running_s']:.1f}s; "
            f"idle {args.idle_s:.0f}s ...",
            flush=True,
        )
        time.sleep(args.idle_s)
        assert a.proc is not None and a.proc.pid is not None
        for i in range(args.samples):
            if i:
                time.sleep(args.interval_s)
            samples.append(sample(a.proc.pid))
            total = sum(v[0] for v in samples[-1].values()), sum(v[1] for v in samples[-1].values())
            print(
                f"  sample {i + 1}/{args.samples}: {len(samples[-1])} processes, "
                f"RSS {total[0]:.0f} MB, PSS {total[1]:.0f} MB",
                flush=True,
            )
    finally:
        with common.cleaning_up():
            steps: list[common.Step] = []
            if agent is not None:
                steps.append(("stop klet up", agent.stop))
            steps.append(("close event loop", runner.close))
            if cp is not None:
                steps.append(("stop control plane", cp.stop))
            steps.append(("stop devstack", stack.stop))
            steps.append(("unmount under the run dir", lambda: unmount_under(run_dir)))
            common.run_steps(steps, run_dir=run_dir, keep=args.keep)
    summary = summarize(samples)
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": args.mode,
        "config": {
            "pods": args.pods,
            "idle_s": args.idle_s,
            "samples": args.samples,
            "interval_s": args.interval_s,
        },
        "machine": {**at_start, "host": platform.node()},
        "commit_at_end": machine()["commit"],
        "kubernetes": version_of(bin_dir / "kube-apiserver") if bin_dir else None,
        "load_before": load_before,
        "load_after": common.load(),
        "timings": timings,
        "units": "MB (10^6 bytes)",
        "samples": samples,
        "median": {k: {"rss_mb": v[0], "pss_mb": v[1]} for k, v in summary.items()},
        "run_seconds": time.perf_counter() - began,
    }
    common.write_results(args.output, res)
    mach = res["machine"]
    print(
        f"\n{args.mode}, {args.pods} pods, median of {len(samples)} readings after "
        f"{args.idle_s:.0f} s idle; commit {mach['commit']} at start, {res['commit_at_end']} at end"
        f"{' (uncommitted changes)' if mach['worktree_dirty'] else ''}; load "
        f"{load_before} before, {res['load_after']} after\n"
    )
    print(markdown_table(summary))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    common.entry(main)

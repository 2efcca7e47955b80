"""Benchmark: klet side by side with the upstream kubelet, same machine, same workloads.

Run as root with ``make bench-compare`` (``.venv/bin/python bench/compare.py``). It builds
the upstream kubelet if it is not cached (``tools/cluster/build.sh --with-kubelet``),
starts one DevStack (registry with the test images; its containerd is klet's) plus a
second private containerd for the kubelet (its own root, state, socket and bridge
network, pulling from the same registry), and then runs both agents standalone:

- klet: ``klet up`` (all five services and its own Redis) with a private manifest
  directory, the read-only port and the first containerd;
- upstream: ``kubelet --config`` (staticPodPath, readOnlyPort, cgroupfs, its own
  cgroupRoot, root and cert dirs, pod log dir, no kubeconfig) on the second containerd.

Both stay up for the whole run. Each round runs every workload on klet, then on the
kubelet (klet, upstream, klet, upstream, ...), so machine noise hits both:

1. single pods (``COMPARE_SINGLES`` per round): manifest written -> Running with all
   containers ready in ``/pods``; the container's process SIGKILLed (found by its
   container ID in ``/proc/*/cgroup``) -> ``/pods`` shows it terminated, -> running and
   ready again with restartCount + 1; manifest removed -> CRI lists no running container
   of the pod (*stopped*) -> CRI lists no container of it at all (*gone*);
2. bursts (``COMPARE_BURSTS``, default 10,30,110): all manifests written at once,
   per-pod and all Running+ready, and the CPU seconds the agent's processes used until
   then; all removed at once -> no running container.

Then, once per side and per size of ``COMPARE_IDLE_PODS`` (110,250): that many pods
started at once (all Running+ready, the agents' CPU seconds meanwhile) and left idle for
``COMPARE_IDLE_S`` (300) seconds while /proc is sampled every second (CPU in cores of
all the agent's processes: klet up, its five services and Redis; the kubelet process;
RSS summed, PSS summed); after the first size, the agent restarted (SIGTERM, start
again) -> all pods Running+ready in ``/pods`` again, and the containers restarted by it
(container ID or restartCount changed: must be 0). Both agents get ``maxPods`` as large
as the largest size.

Before the agents start, the **raw CRI floor** of each burst size (``Floor`` of
bench/run.py: RunPodSandbox, status, CreateContainer, StartContainer, all at once) is
measured ``COMPARE_ROUNDS`` times on klet's containerd, so the table can say how far each
agent's burst is from what the runtime itself needs, in the same run.

Prints one table (medians, p99 when there are 100 samples or more, else the max, and
the ratio klet/upstream of the medians; the idle CPU also as the mean and the p95 of the
window's 1 s samples, since a median hides the periodic passes), writes
``bench/results/compare-latest.json`` and, with ``--readme``, replaces the measured
table in bench/README.md.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import dataclasses
import datetime as dt
import functools
import json
import logging
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from klet.cri import RuntimeClient  # noqa: E402
from klet.cri import labels as L  # noqa: E402
from klet.cri.types import ContainerState  # noqa: E402
from klet.devstack import BUSYBOX_IMAGE, PAUSE_IMAGE, DevStack, ManagedProcess, free_port  # noqa: E402
from klet.devstack.cni import CniNetwork, choose_subnet  # noqa: E402
from klet.devstack.containerd import Containerd, unmount_under  # noqa: E402
from klet.devstack.images import build, standard_images, write_oci_archive  # noqa: E402

from bench import common  # noqa: E402
from bench.run import MANIFEST, Floor, machine, make_client, pod_ready  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "compare-latest.json"
README = ROOT / "bench" / "README.md"
KUBELET_BUILD = ROOT / "tools" / "cluster" / "build.sh"
# The kubelet's pods live under this cgroup root; klet's under /kubepods (klet.model.layout).
UPSTREAM_CGROUP_ROOT = "/klet-bench-upstream"
# Host sysctls the kubelet rewrites at start (HOST_NOTES.md); restored on exit.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
POLL_SINGLE_S = 0.020
POLL_BURST_S = 0.100
TIMEOUT_S = 600.0
GONE_TIMEOUT_S = 150.0  # the kubelet removes dead containers in its 1-minute container GC
START_TIMEOUT_S = 120.0
RESTART_SETTLE_S = 10.0  # after all are ready again, restarts caused late still count
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
README_BEGIN = "<!-- compare:begin -->"
README_END = "<!-- compare:end -->"

log = logging.getLogger("bench.compare")


# -- pure helpers: statistics and the table ----------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


P99_MIN_SAMPLES = 100


def tail(
    samples: Sequence[float], *, q: int = 99, min_samples: int = P99_MIN_SAMPLES
) -> tuple[float, str]:
    """The q-th percentile when there are enough samples for it to mean something (at
    least `min_samples`), else the max."""
    if len(samples) >= min_samples:
        return percentile(samples, q), f"p{q}"
    return max(samples), "max"


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: a measurement's samples on both sides, in its unit."""

    label: str
    unit: str  # "s", "cores", "MB", "cpu-s" (CPU seconds), "count", "x" (a ratio)
    klet: Sequence[float]
    upstream: Sequence[float]
    # For a value that is a distribution of its own (CPU p95 over the idle window), the
    # single number per side, not a median of samples.
    kind: str = "samples"


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"
    if unit == "cores":
        return f"{value:.3f}"
    if unit == "MB":
        return f"{value:.0f} MB"
    if unit == "cpu-s":
        return f"{value:.1f} CPU-s"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.0f}"


def row_cells(row: Row, *, q: int = 99, min_samples: int = P99_MIN_SAMPLES) -> list[str]:
    """label, n, klet median, klet tail, upstream median, upstream tail, ratio (the tail:
    see `tail`)."""
    cells = [row.label, f"{len(row.klet)}/{len(row.upstream)}"]
    medians: list[float | None] = []
    for xs in (row.klet, row.upstream):
        if not xs:
            cells += ["-", "-"]
            medians.append(None)
            continue
        med = percentile(xs, 50)
        medians.append(med)
        if len(xs) == 1:
            cells += [_fmt(med, row.unit), ""]
        else:
            value, name = tail(xs, q=q, min_samples=min_samples)
            cells += [_fmt(med, row.unit), f"{_fmt(value, row.unit)} ({name})"]
    k, u = medians
    if k is None or u is None:
        cells.append("-")
    elif u == 0:
        cells.append("=" if k == 0 else "inf")
    else:
        cells.append(f"{k / u:.2f}x")
    return cells


HEADER = [
    "measurement",
    "n klet/up",
    "klet median",
    "klet tail",
    "upstream median",
    "upstream tail",
    "klet/upstream",
]


def markdown_table(rows: Iterable[Row], *, q: int = 99, min_samples: int = P99_MIN_SAMPLES) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row_cells(r, q=q, min_samples=min_samples)) + " |" for r in rows]
    return "\n".join(lines)


def text_table(rows: Iterable[Row], *, q: int = 99, min_samples: int = P99_MIN_SAMPLES) -> str:
    body = [HEADER, *(row_cells(r, q=q, min_samples=min_samples) for r in rows)]
    widths = [max(len(line[i]) for line in body) for i in range(len(HEADER))]
    out = []
    for line in body:
        out.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    return "\n".join(out)


def replace_section(
    text: str, section: str, *, begin: str = README_BEGIN, end_marker: str = README_END
) -> str:
    """``text`` with what lies between the markers (the compare table's by default)
    replaced by ``section`` (markers appended at the end when missing)."""
    block = f"{begin}\n{section.rstrip()}\n{end_marker}"
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        return text.rstrip() + "\n\n" + block + "\n"
    return text[:start] + block + text[end + len(end_marker) :]


def cpu_cores(ticks_before: int, ticks_after: int, seconds: float) -> float:
    """CPU used between two readings of utime+stime (clock ticks), in cores."""
    return (ticks_after - ticks_before) / CLK_TCK / seconds if seconds > 0 else 0.0


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip() else default


def env_ints(name: str, default: Sequence[int]) -> list[int]:
    raw = os.environ.get(name, "")
    return [int(x) for x in raw.split(",") if x.strip()] if raw.strip() else list(default)


# -- /proc --------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime + stime in ticks) of a live process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def process_tree(root: int) -> dict[int, int]:
    """pid -> CPU ticks of ``root`` and all its descendants."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                stats[int(entry.name)] = st
    if root not in stats:
        return {}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        out[pid] = stats[pid][1]
        todo += children.get(pid, [])
    return out


def memory_mb(pids: Iterable[int]) -> tuple[float, float]:
    """(RSS, PSS) summed over ``pids``, MB (10^6 bytes)."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss * 1024 / 1e6, pss * 1024 / 1e6


def container_pid(container_id: str) -> int:
    """The container's init process: the one in its cgroup whose parent is not."""
    inside: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cg = (entry / "cgroup").read_text()
        except OSError:
            continue
        if container_id in cg:
            st = _stat(int(entry.name))
            if st is not None:
                inside[int(entry.name)] = st[0]
    roots = [pid for pid, ppid in inside.items() if ppid not in inside]
    if len(roots) != 1:
        raise LookupError(f"container {container_id[:12]}: init candidates {roots}")
    return roots[0]


# -- the two agents ------------------------------------------------------------------------


class Agent(abc.ABC):
    """One node agent under test: its process, manifest directory, read-only port, CRI."""

    name = ""

    def __init__(self, dir: Path, node_name: str, endpoint: str) -> None:
        self.dir = dir
        self.node_name = node_name
        self.endpoint = endpoint
        self.manifests = dir / "manifests"
        self.ro_port = free_port()
        self.proc: ManagedProcess | None = None

    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The agent's command line."""

    def env(self) -> dict[str, str] | None:
        return None

    def start(self) -> None:
        self.manifests.mkdir(parents=True, exist_ok=True)
        self.proc = ManagedProcess(self.name, self.argv(), dir=self.dir, env=self.env())
        self.proc.start()
        self.proc.wait_ready(self.serving, START_TIMEOUT_S, f"/pods on {self.ro_port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout_s=60)
            self.proc = None

    def serving(self) -> bool:
        self.pods()
        return True

    def pods(self) -> dict[str, dict[str, Any]]:
        """``/pods`` of the read-only port by pod name (the kubelet answers null items)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ro_port}/pods", timeout=10) as r:
            items = json.loads(r.read()).get("items") or []
        return {p["metadata"]["name"]: p for p in items}

    def pids(self) -> dict[int, int]:
        """Every process of the agent with its CPU ticks."""
        return process_tree(self.proc.pid) if self.proc is not None and self.proc.pid else {}

    def full(self, name: str) -> str:
        return f"{name}-{self.node_name}"

    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"


class KletAgent(Agent):
    name = "klet"

    def __init__(self, dir: Path, node_name: str, endpoint: str, *, max_pods: int = 110) -> None:
        super().__init__(dir, node_name, endpoint)
        self.max_pods = max_pods

    def argv(self) -> list[str]:
        return [
            str(ROOT / ".venv" / "bin" / "klet"),
            "up",
            "--run-dir",
            str(self.dir / "run"),
            "--hostname-override",
            self.node_name,
            "--pod-manifest-path",
            str(self.manifests),
            "--read-only-port",
            str(self.ro_port),
            "--container-runtime-endpoint",
            self.endpoint,
            "--service-port",
            "0",
            "--max-pods",
            str(self.max_pods),
        ]


class UpstreamAgent(Agent):
    name = "kubelet"

    def __init__(
        self, dir: Path, node_name: str, endpoint: str, binary: Path, *, max_pods: int = 110
    ) -> None:
        super().__init__(dir, node_name, endpoint)
        self.binary = binary
        self.max_pods = max_pods

    def config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "staticPodPath": str(self.manifests),
            "containerRuntimeEndpoint": self.endpoint,
            "maxPods": self.max_pods,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": UPSTREAM_CGROUP_ROOT,
            "failSwapOn": False,
            "failCgroupV1": False,
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": self.ro_port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "podLogsDir": str(self.dir / "pod-logs"),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
        }

    def argv(self) -> list[str]:
        cfg = self.dir / "kubelet-config.json"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        if not cfg.exists():  # ports stay the same across a restart
            cfg.write_text(json.dumps(self.config(), indent=2) + "\n")
        return [
            str(self.binary),
            "--config",
            str(cfg),
            "--root-dir",
            str(self.dir / "root"),
            "--cert-dir",
            str(self.dir / "pki"),
            "--hostname-override",
            self.node_name,
            "--v",
            "1",
        ]


def make_cgroup_root(name: str) -> list[Path]:
    """``name`` in every mounted hierarchy (v1: one per controller; v2: the unified one)."""
    base = Path("/sys/fs/cgroup")
    made = []
    dirs = (
        [base]
        if (base / "cgroup.controllers").exists()
        else [d for d in base.iterdir() if d.is_dir() and os.path.ismount(d)]
    )
    for d in dirs:
        target = d / name.strip("/")
        target.mkdir(exist_ok=True)
        made.append(target)
    return made


def remove_cgroups(dirs: Iterable[Path]) -> None:
    """rmdir each tree bottom-up (the kernel refuses a cgroup that still has tasks)."""
    for top in dirs:
        subdirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*subdirs, top]:
            try:
                d.rmdir()
            except OSError as err:
                log.warning("cannot remove cgroup %s: %s", d, err)


# -- the workloads -------------------------------------------------------------------------


def wait(
    check: Callable[[], bool],
    what: str,
    *,
    poll_s: float,
    timeout_s: float = TIMEOUT_S,
) -> float:
    """Poll ``check`` until it holds; the seconds it took."""
    t0 = time.perf_counter()
    while True:
        try:
            if check():
                return time.perf_counter() - t0
        except (OSError, ValueError) as err:  # /pods briefly unreachable
            log.debug("poll %s: %s", what, err)
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def main_status(pod: dict[str, Any] | None) -> dict[str, Any]:
    if not pod:
        return {}
    for c in pod.get("status", {}).get("containerStatuses") or []:
        if c.get("name") == "main":
            return dict(c)
    return {}


class Workloads:
    def __init__(self, runner: asyncio.Runner) -> None:
        self.runner = runner
        self.clients: dict[str, RuntimeClient] = {}

    def cri(self, agent: Agent) -> RuntimeClient:
        if agent.endpoint not in self.clients:
            self.clients[agent.endpoint] = self.runner.run(make_client(agent.endpoint))
        return self.clients[agent.endpoint]

    def containers(self, agent: Agent) -> dict[str, list[tuple[str, bool]]]:
        """pod name -> [(container ID, running)] as CRI lists them."""
        out: dict[str, list[tuple[str, bool]]] = {}
        for c in self.runner.run(self.cri(agent).list_containers()):
            out.setdefault(c.labels.get(L.POD_NAME, ""), []).append(
                (c.id, c.state is ContainerState.RUNNING)
            )
        return out

    def write(self, agent: Agent, names: Sequence[str]) -> None:
        for n in names:
            tmp = agent.manifests / f".{n}.tmp"
            tmp.write_text(MANIFEST.format(name=n, image=BUSYBOX_IMAGE))
            tmp.rename(agent.manifests / f"{n}.yaml")

    def remove(self, agent: Agent, names: Sequence[str]) -> None:
        for n in names:
            (agent.manifests / f"{n}.yaml").unlink()

    def start(self, agent: Agent, names: Sequence[str]) -> tuple[list[float], float, float]:
        """Write all manifests at once; (per-pod seconds to Running+ready, all, the CPU
        seconds the agent's processes used meanwhile)."""
        fulls = {agent.full(n) for n in names}
        ready: dict[str, float] = {}
        poll_s = POLL_SINGLE_S if len(names) == 1 else POLL_BURST_S
        before = agent.pids()
        t0 = time.perf_counter()
        self.write(agent, names)

        def all_ready() -> bool:
            pods = agent.pods()
            now = time.perf_counter() - t0
            for f in fulls - ready.keys():
                if pod_ready(pods.get(f)):
                    ready[f] = now
            return len(ready) == len(fulls)

        wait(all_ready, f"{agent.name}: {len(names)} pods Running", poll_s=poll_s)
        took = time.perf_counter() - t0
        after = agent.pids()
        # Processes that started or ended in between count only where both readings exist.
        common = before.keys() & after.keys()
        cpu_s = sum(after[p] - before[p] for p in common) / CLK_TCK
        return sorted(ready.values()), took, cpu_s

    def stop(self, agent: Agent, names: Sequence[str], *, gone: bool) -> tuple[float, float | None]:
        """Remove the manifests; seconds until CRI lists no running container of them
        and (``gone``) until it lists none at all (None: not measured or timed out)."""
        fulls = {agent.full(n) for n in names}
        poll_s = POLL_SINGLE_S if len(names) == 1 else POLL_BURST_S
        t0 = time.perf_counter()
        self.remove(agent, names)

        def none_running() -> bool:
            cs = self.containers(agent)
            return not any(run for f in fulls for _, run in cs.get(f, []))

        stopped = wait(none_running, f"{agent.name}: containers stopped", poll_s=poll_s)
        if not gone:
            return stopped, None
        try:
            wait(
                lambda: not fulls & self.containers(agent).keys(),
                f"{agent.name}: containers removed",
                poll_s=poll_s,
                timeout_s=GONE_TIMEOUT_S,
            )
        except TimeoutError:
            return stopped, None
        return stopped, time.perf_counter() - t0

    def death(self, agent: Agent, name: str) -> tuple[float, float]:
        """SIGKILL the pod's container; (seconds to terminated in /pods, to running again)."""
        full = agent.full(name)
        before = int(main_status(agent.pods().get(full)).get("restartCount", 0))
        running = [cid for cid, run in self.containers(agent).get(full, []) if run]
        if len(running) != 1:
            raise LookupError(f"{full}: running containers {running}")
        pid = container_pid(running[0])
        seen: dict[str, float] = {}
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)

        def check() -> bool:
            pod = agent.pods().get(full)
            st = main_status(pod)
            now = time.perf_counter() - t0
            restarted = int(st.get("restartCount", 0)) > before
            if "dead" not in seen and ("terminated" in st.get("state", {}) or restarted):
                seen["dead"] = now
            if restarted and "running" in st.get("state", {}) and pod_ready(pod):
                seen["again"] = now
                return True
            return False

        wait(check, f"{agent.name}: {full} restarted", poll_s=POLL_SINGLE_S)
        return seen["dead"], seen["again"]

    def idle(self, agent: Agent, seconds: float) -> dict[str, list[float]]:
        """Sample the agent's processes every second for ``seconds``."""
        cores: list[float] = []
        rss: list[float] = []
        pss: list[float] = []
        prev = agent.pids()
        t_prev = time.perf_counter()
        end = t_prev + seconds
        n = 0
        while time.perf_counter() < end:
            time.sleep(1.0)
            cur = agent.pids()
            t = time.perf_counter()
            # Processes that started or ended in between count only where both readings exist.
            common = cur.keys() & prev.keys()
            cores.append(
                cpu_cores(sum(prev[p] for p in common), sum(cur[p] for p in common), t - t_prev)
            )
            if n % 10 == 0:
                r, p = memory_mb(cur)
                rss.append(r)
                pss.append(p)
            n += 1
            prev, t_prev = cur, t
        return {"cores": cores, "rss_mb": rss, "pss_mb": pss, "processes": [float(len(prev))]}

    def restart(self, agent: Agent, names: Sequence[str]) -> tuple[float, int]:
        """Restart the agent with ``names`` running; (seconds from the new start to all
        Running+ready in /pods, containers it restarted)."""
        fulls = {agent.full(n) for n in names}
        before = {
            f: sorted(cid for cid, run in cs if run)
            for f, cs in self.containers(agent).items()
            if f in fulls
        }
        agent.stop()
        t0 = time.perf_counter()
        agent.start()
        wait(
            lambda: all(pod_ready(agent.pods().get(f)) for f in fulls),
            f"{agent.name}: all statuses after restart",
            poll_s=POLL_BURST_S,
        )
        took = time.perf_counter() - t0
        time.sleep(RESTART_SETTLE_S)  # a restart decided late still counts
        after = {
            f: sorted(cid for cid, run in cs if run)
            for f, cs in self.containers(agent).items()
            if f in fulls
        }
        pods = agent.pods()
        restarted = sum(
            1
            for f in fulls
            if before.get(f) != after.get(f)
            or int(main_status(pods.get(f)).get("restartCount", 0)) > 0
        )
        return took, restarted


# -- the run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    rounds: int
    singles: int
    bursts: list[int]
    idle_pods: list[int]
    idle_s: int

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            rounds=env_int("COMPARE_ROUNDS", 3),
            singles=env_int("COMPARE_SINGLES", 3),
            bursts=env_ints("COMPARE_BURSTS", (10, 30, 110)),
            idle_pods=[n for n in env_ints("COMPARE_IDLE_PODS", (110, 250)) if n > 0],
            idle_s=env_int("COMPARE_IDLE_S", 300),
        )

    @property
    def max_pods(self) -> int:
        """maxPods of both agents: the largest workload, and at least the default 110."""
        return max([110, *self.bursts, *self.idle_pods])


Samples = dict[str, dict[str, list[float]]]  # measurement -> side -> samples


def record(samples: Samples, key: str, side: str, *values: float) -> None:
    samples.setdefault(key, {}).setdefault(side, []).extend(values)


FAILURES = (TimeoutError, LookupError, OSError)


def give_up(w: Workloads, agent: Agent, what: str, err: Exception, samples: Samples) -> None:
    """Report a workload that failed, note it, and remove whatever pods it left."""
    print(f"  {agent.name:<8} FAILED {what}: {err}", flush=True)
    record(samples, "failures", agent.name, 1.0)
    left = [p.stem for p in agent.manifests.glob("*.yaml")]
    if left:
        try:
            w.stop(agent, left, gone=False)
        except FAILURES as again:
            print(f"  {agent.name:<8} could not remove {len(left)} pods: {again}", flush=True)


def run_round(w: Workloads, agent: Agent, cfg: Config, r: int, samples: Samples) -> None:
    for i in range(cfg.singles):
        try:
            single(w, agent, f"r{r}s{i}", samples)
        except FAILURES as err:
            give_up(w, agent, f"single pod {i}", err, samples)
    for m in cfg.bursts:
        try:
            burst(w, agent, [f"r{r}b{m}p{j}" for j in range(m)], samples)
        except FAILURES as err:
            give_up(w, agent, f"burst of {m}", err, samples)


def settle(w: Workloads, agent: Agent) -> None:
    """Wait until `agent`'s runtime lists no sandbox, so the other side's next phase does
    not share the two cores with this side's clean-up: the kubelet removes the sandboxes
    of deleted pods in its 1-minute container GC, after the bench saw their containers
    stop, and that removal used to land in klet's next burst (a burst of 10 took 6 s
    instead of 1.6 in the 2026-11-29 run). Not timed; a side that keeps a sandbox past
    GONE_TIMEOUT_S is reported and the bench goes on."""
    try:
        took = wait(
            lambda: not w.runner.run(w.cri(agent).list_pod_sandboxes()),
            f"{agent.name}: no sandbox left",
            poll_s=0.5,
            timeout_s=GONE_TIMEOUT_S,
        )
    except TimeoutError as err:
        print(f"  {agent.name:<8} {err}; going on", flush=True)
        return
    print(f"  {agent.name:<8} settled: no sandbox after {took:.1f}s", flush=True)


def single(w: Workloads, agent: Agent, name: str, samples: Samples) -> None:
    side = agent.name
    per, _, _ = w.start(agent, [name])
    record(samples, "single_start", side, *per)
    dead, again = w.death(agent, name)
    record(samples, "death_terminated", side, dead)
    record(samples, "death_restarted", side, again)
    stopped, gone = w.stop(agent, [name], gone=True)
    record(samples, "single_stopped", side, stopped)
    if gone is not None:
        record(samples, "single_gone", side, gone)
    print(
        f"  {side:<8} single {name}: running {per[0]:.3f}s, killed -> terminated "
        f"{dead:.3f}s, restarted {again:.3f}s; removed -> stopped {stopped:.3f}s, "
        f"gone {'-' if gone is None else f'{gone:.3f}s'}",
        flush=True,
    )


def burst(w: Workloads, agent: Agent, names: Sequence[str], samples: Samples) -> None:
    side, m = agent.name, len(names)
    per, total, cpu_s = w.start(agent, names)
    record(samples, f"burst{m}_per_pod", side, *per)
    record(samples, f"burst{m}_all", side, total)
    record(samples, f"burst{m}_cpu", side, cpu_s)
    stopped, _ = w.stop(agent, names, gone=False)
    record(samples, f"burst{m}_stopped", side, stopped)
    print(
        f"  {side:<8} burst {m}: all running {total:.2f}s (median pod "
        f"{percentile(per, 50):.2f}s, agent CPU {cpu_s:.1f} s); removed -> "
        f"all stopped {stopped:.2f}s",
        flush=True,
    )


def idle_and_restart(
    w: Workloads, agent: Agent, cfg: Config, n: int, samples: Samples, *, restart: bool
) -> None:
    """`n` pods started at once, idle for idle_s, the agent restarted (`restart`), all
    removed; every key carries `n` (``idle110_cores``)."""
    side, k = agent.name, f"idle{n}"
    names = [f"idle{n}p{j}" for j in range(n)]
    _, total, cpu_s = w.start(agent, names)
    record(samples, f"{k}_start_all", side, total)
    record(samples, f"{k}_start_cpu", side, cpu_s)
    print(
        f"  {side:<8} {n} pods running after {total:.1f}s (agent CPU {cpu_s:.1f} s); "
        f"idle {cfg.idle_s}s ...",
        flush=True,
    )
    idle = w.idle(agent, cfg.idle_s)
    record(samples, f"{k}_cores", side, *idle["cores"])
    record(samples, f"{k}_rss", side, *idle["rss_mb"])
    record(samples, f"{k}_pss", side, *idle["pss_mb"])
    record(samples, f"{k}_processes", side, *idle["processes"])
    print(
        f"  {side:<8} idle: cores mean {statistics.fmean(idle['cores']):.3f} p50 "
        f"{percentile(idle['cores'], 50):.3f} p95 {percentile(idle['cores'], 95):.3f}, "
        f"RSS {percentile(idle['rss_mb'], 50):.0f} MB",
        flush=True,
    )
    if restart:
        took, restarted = w.restart(agent, names)
        record(samples, f"{k}_restart_all_ready", side, took)
        record(samples, f"{k}_restart_restarts", side, float(restarted))
        print(
            f"  {side:<8} restart -> all ready {took:.1f}s, {restarted} containers restarted",
            flush=True,
        )
    stopped, _ = w.stop(agent, names, gone=False)
    record(samples, f"{k}_stopped_all", side, stopped)


def cri_floor(w: Workloads, agent: Agent, cfg: Config, run_dir: Path, samples: Samples) -> None:
    """The raw CRI floor of every burst size on `agent`'s containerd (before it starts):
    all pods started at once straight through CRI, then removed."""
    floor = Floor(w.cri(agent), f"floor{uuid.uuid4().hex[:6]}", run_dir / "floor-logs")
    for r in range(cfg.rounds):
        for m in cfg.bursts:
            got = w.runner.run(floor.burst(m))
            record(samples, f"burst{m}_floor", "cri", got["all_running"])
            print(
                f"  raw CRI  burst {m} (round {r + 1}): all started "
                f"{got['all_running']:.2f}s, removed {got['all_removed']:.2f}s",
                flush=True,
            )


def table_rows(samples: Samples, cfg: Config) -> list[Row]:
    def row(label: str, key: str, unit: str = "s") -> Row:
        s = samples.get(key, {})
        return Row(label, unit, s.get("klet", []), s.get("kubelet", []))

    def window(n: int, what: str, key: str, of: Callable[[Sequence[float]], float]) -> Row:
        """One number per side over the whole window (the 1 s samples' p95, their mean)."""
        s = samples.get(key, {})
        return Row(
            f"idle, {n} pods: CPU {what} over the window (cores)",
            "cores",
            [of(s["klet"])] if s.get("klet") else [],
            [of(s["kubelet"])] if s.get("kubelet") else [],
        )

    def over_floor(m: int) -> list[Row]:
        """The floor itself, then each agent's burst median over the floor's median."""
        floor = samples.get(f"burst{m}_floor", {}).get("cri", [])
        if not floor:
            return []
        base = percentile(floor, 50)
        ratios = [
            [percentile(xs, 50) / base]
            if (xs := samples.get(f"burst{m}_all", {}).get(side))
            else []
            for side in ("klet", "kubelet")
        ]
        return [
            Row(f"burst {m}: raw CRI floor, all started (klet's containerd)", "s", floor, []),
            Row(f"burst {m}: all Running+ready / raw CRI floor", "x", ratios[0], ratios[1]),
        ]

    rows = [
        row("1 pod: manifest written -> Running+ready", "single_start"),
        row("container SIGKILLed -> /pods shows terminated", "death_terminated"),
        row("container SIGKILLed -> running+ready again", "death_restarted"),
        row("1 pod: manifest removed -> no running container", "single_stopped"),
        row("1 pod: manifest removed -> CRI lists no container", "single_gone"),
    ]
    for m in cfg.bursts:
        rows += [
            row(f"burst {m}: per pod -> Running+ready", f"burst{m}_per_pod"),
            row(f"burst {m}: all Running+ready", f"burst{m}_all"),
            row(f"burst {m}: agent CPU until all Running+ready", f"burst{m}_cpu", "cpu-s"),
            row(f"burst {m}: removed -> none running", f"burst{m}_stopped"),
            *over_floor(m),
        ]
    for i, n in enumerate(cfg.idle_pods):
        k = f"idle{n}"
        rows += [
            row(f"{n} pods: all Running+ready", f"{k}_start_all"),
            row(f"{n} pods: agent CPU until all Running+ready", f"{k}_start_cpu", "cpu-s"),
            row(f"idle, {n} pods: CPU per 1 s sample (cores)", f"{k}_cores", "cores"),
            window(n, "mean", f"{k}_cores", statistics.fmean),
            window(n, "p95", f"{k}_cores", lambda xs: percentile(xs, 95)),
            row(f"idle, {n} pods: RSS of all processes", f"{k}_rss", "MB"),
            row(f"idle, {n} pods: PSS of all processes", f"{k}_pss", "MB"),
        ]
        if i == 0:
            rows += [
                row("agent processes", f"{k}_processes", "count"),
                row(f"agent restarted, {n} pods -> all Running+ready", f"{k}_restart_all_ready"),
                row("containers restarted by the agent restart", f"{k}_restart_restarts", "count"),
            ]
        rows.append(row(f"{n} pods: removed -> none running", f"{k}_stopped_all"))
    if samples.get("failures"):
        rows.append(row("workloads that failed (timed out, see the log)", "failures", "count"))
    return rows


def kubelet_binary() -> tuple[Path, str]:
    """Build (or find cached) the upstream kubelet; its path and version."""
    out = subprocess.run(
        ["bash", str(KUBELET_BUILD), "--with-kubelet"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    binary = Path(out.strip().splitlines()[-1]) / "kubelet"
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return binary, version


def second_containerd(stack: DevStack, dir: Path) -> Containerd:
    """A containerd of its own for the kubelet (which kills every pod it does not know),
    pulling from the stack's registry, with the pause image imported."""
    c = Containerd.for_registry(dir, stack.registry_address, sandbox_image=PAUSE_IMAGE)
    assert stack.containerd is not None
    salt = 0
    while c.network.subnet == stack.containerd.network.subnet:  # the hash picked the same /16
        salt += 1
        c.network = CniNetwork(dir / "cni", subnet=choose_subnet(f"{dir}#{salt}"))
    c.start()
    pause = next(s for s in standard_images().values() if s.reference == PAUSE_IMAGE)
    archive = dir / "pause.oci.tar"
    write_oci_archive(build(pause), archive)
    c.import_image(archive)
    return c


def read_sysctls() -> dict[str, str]:
    return {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS}


def restore_sysctls(saved: Mapping[str, str]) -> None:
    for k, v in saved.items():
        try:
            if Path("/proc/sys", k).read_text().strip() != v:
                Path("/proc/sys", k).write_text(v)
        except OSError as err:
            print(f"bench: could not restore {k}={v}: {err}", file=sys.stderr)


def readme_section(res: dict[str, Any], rows: Sequence[Row]) -> str:
    cfg = res["config"]
    mach = res["machine"]
    return "\n".join(
        [
            f"Measured {res['date']} on `{mach['host']}`: {mach['nproc']} cores, kernel "
            f"{mach['kernel']}, cgroup v{res['cgroup_version']}, {res['runtime_version']} (one "
            f"instance per agent), klet commit `{mach['commit']}`"
            f"{' (uncommitted changes)' if mach['worktree_dirty'] else ''}, "
            f"{res['kubelet_version']}; "
            f"load average {res['load_before']} before, {res['load_after']} after "
            "(shared machine); "
            f"{res['run_seconds'] / 60:.0f} min in all.",
            "",
            f"Configuration: `COMPARE_ROUNDS={cfg['rounds']} COMPARE_SINGLES={cfg['singles']} "
            f"COMPARE_BURSTS={','.join(map(str, cfg['bursts']))} "
            f"COMPARE_IDLE_PODS={','.join(map(str, cfg['idle_pods']))} "
            f"COMPARE_IDLE_S={cfg['idle_s']}`. "
            "Reproduce with `make bench-compare` (same variables).",
            "",
            markdown_table(rows),
        ]
    )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument(
        "--readme",
        action="store_true",
        help="write the table into bench/README.md between the compare markers",
    )
    common.add_keep_and_output(p, RESULTS, keep_help="keep the run dir (logs, configs)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if (code := common.begin(root_for="it starts containerd and the kubelet")) is not None:
        return code
    cfg = Config.from_env()
    binary, kubelet_version = kubelet_binary()
    began = time.perf_counter()
    run_id = uuid.uuid4().hex[:6]
    run_dir = Path(tempfile.mkdtemp(prefix="kcmp-", dir="/tmp"))
    stack = DevStack(run_dir / "s")
    runner = asyncio.Runner()
    w = Workloads(runner)
    upstream_cd: Containerd | None = None
    agents: list[Agent] = []
    cgroups: list[Path] = []
    sysctls = read_sysctls()
    load_before = common.load()
    samples: Samples = {}
    failed: Exception | None = None
    version_text = "?"
    try:
        print(f"bench: devstack and a second containerd in {run_dir} ...", flush=True)
        stack.start()
        upstream_cd = second_containerd(stack, run_dir / "c2")
        klet = KletAgent(
            run_dir / "klet", f"cmpk{run_id}", stack.runtime_endpoint, max_pods=cfg.max_pods
        )
        kube = UpstreamAgent(
            run_dir / "kube",
            f"cmpu{run_id}",
            upstream_cd.endpoint,
            binary,
            max_pods=cfg.max_pods,
        )
        for a in (klet, kube):  # "image present" for both
            runner.run(w.cri(a).pull_image(BUSYBOX_IMAGE))
        print("bench: the raw CRI floor on klet's containerd ...", flush=True)
        cri_floor(w, klet, cfg, run_dir, samples)
        cgroups = make_cgroup_root(UPSTREAM_CGROUP_ROOT)
        for a in (klet, kube):
            print(
                f"bench: starting {a.name} (node {a.node_name}, read-only port {a.ro_port})",
                flush=True,
            )
            a.start()
            agents.append(a)
        version = runner.run(w.cri(klet).version())
        version_text = f"{version.runtime_name} {version.runtime_version}"
        for r in range(cfg.rounds):
            print(f"bench: round {r + 1}/{cfg.rounds}", flush=True)
            for a in (klet, kube):
                run_round(w, a, cfg, r, samples)
                settle(w, a)
        for i, n in enumerate(cfg.idle_pods):
            for a in (klet, kube):
                try:
                    idle_and_restart(w, a, cfg, n, samples, restart=i == 0)
                except FAILURES as err:
                    give_up(w, a, f"{n} idle pods", err, samples)
                settle(w, a)
    except Exception as err:  # noqa: BLE001 - the table of what was measured still counts
        failed = err
        print(f"bench: FAILED: {err!r}", file=sys.stderr)
    finally:
        with common.cleaning_up():
            cleanup(agents, w, stack, upstream_cd, cgroups, sysctls, run_dir, args.keep)
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg),
        "machine": {**machine(), "host": platform.node()},
        "cgroup_version": 2 if Path("/sys/fs/cgroup/cgroup.controllers").exists() else 1,
        "runtime_version": version_text,
        "kubelet_version": kubelet_version,
        "load_before": load_before,
        "load_after": common.load(),
        "samples": samples,
        "units": "seconds, cores, MB (10^6 bytes)",
        "error": repr(failed) if failed else None,
        "run_seconds": time.perf_counter() - began,
    }
    rows = table_rows(samples, cfg)
    common.write_results(args.output, res)
    print()
    print(text_table(rows))
    print(f"results: {args.output}")
    if args.readme and failed is None:
        README.write_text(replace_section(README.read_text(), readme_section(res, rows)))
        print(f"table written to {README}")
    return 1 if failed is not None or samples.get("failures") else 0


def cleanup(
    agents: Sequence[Agent],
    w: Workloads,
    stack: DevStack,
    upstream_cd: Containerd | None,
    cgroups: Sequence[Path],
    sysctls: Mapping[str, str],
    run_dir: Path,
    keep: bool,
) -> None:
    """Every step is attempted even if an earlier one fails."""
    steps: list[common.Step] = []
    for a in agents:
        steps.append((f"stop {a.name}", a.stop))
    for c in list(w.clients.values()):
        steps.append(("close CRI client", functools.partial(w.runner.run, c.close())))
    steps.append(("close event loop", w.runner.close))
    if upstream_cd is not None:
        steps.append(("stop the kubelet's containerd", upstream_cd.stop))
    steps.append(("stop devstack", stack.stop))
    steps.append(("unmount under the run dir", lambda: unmount_under(run_dir)))
    steps.append(("remove the kubelet's cgroups", lambda: remove_cgroups(cgroups)))
    steps.append(("restore sysctls", lambda: restore_sysctls(sysctls)))
    common.run_steps(steps, run_dir=run_dir, keep=keep)


if __name__ == "__main__":
    common.entry(main)

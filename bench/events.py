"""Benchmark: container death → status updated, with and without runtime events.

Run as root with ``make bench-events`` (``.venv/bin/python bench/events.py``). It starts a
private DevStack (Redis, registry, containerd 1.6) and, for each mode, a KletNode with N
static pods (one container, ``restartPolicy: Always``) and, one pod at a time:

1. finds the host PID of the pod's container (``ctr tasks ls``) and SIGKILLs it;
2. polls ``/pods`` (read-only API) every ``--poll-ms`` until the container's death shows:
   its state is ``terminated``, or it already runs again with ``restartCount`` 1 and a
   ``lastState.terminated`` (the first restart has no back-off and may beat a poll);
3. keeps polling until it is running and ready again with ``restartCount`` 1.

Modes: ``evented`` (the default: containerd's task events wake the pod worker; the
safety-net relist every 20 s) and ``relist`` (``featureGates.EventedPLEG=false``: the
generic PLEG relisting every second, as upstream's kubelet does by default). Prints
median, p99, min and max per mode and writes ``bench/results/events.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import asyncio  # noqa: E402

from klet.cri import RuntimeClient  # noqa: E402
from klet.devstack import BUSYBOX_IMAGE, DevStack  # noqa: E402

from bench import common  # noqa: E402
from bench.run import MANIFEST, cleanup, machine, make_client, remove_sandboxes  # noqa: E402
from tests.harness.node import KletNode  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "events.json"
TIMEOUT_S = 120.0
MODES: dict[str, list[str]] = {
    "evented": ["--evented-pleg-relist-period", "20s"],  # the default (the harness says 1s)
    "relist": ["--feature-gates", "EventedPLEG=false"],
}

log = logging.getLogger("bench")


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..1) by linear interpolation between closest ranks."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(xs: Sequence[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p99": percentile(xs, 0.99),
        "min": min(xs),
        "max": max(xs),
        "samples": list(xs),
    }


def task_pid(stack: DevStack, container_id: str) -> int:
    assert stack.containerd is not None
    for line in stack.containerd.ctr(["tasks", "ls"], timeout_s=30).splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise LookupError(f"no task {container_id}")


def main_status(node: KletNode, pod: str) -> dict[str, Any] | None:
    p = node.pods().get(f"{pod}-{node.node_name}")
    if p is None:
        return None
    for c in p.get("status", {}).get("containerStatuses") or []:
        if c["name"] == "main":
            return dict(c)
    return None


def died(c: dict[str, Any] | None) -> bool:
    if c is None:
        return False
    if "terminated" in c.get("state", {}):
        return True
    return c.get("restartCount", 0) >= 1 and "terminated" in c.get("lastState", {})


def restarted(c: dict[str, Any] | None) -> bool:
    return (
        c is not None
        and c.get("restartCount", 0) >= 1
        and "running" in c.get("state", {})
        and bool(c.get("ready"))
    )


def poll(node: KletNode, pod: str, done: Any, poll_s: float) -> float:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            if done(main_status(node, pod)):
                return time.perf_counter()
        except OSError:
            pass  # the read-only API did not answer this time
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pod}: no {done.__name__} within {TIMEOUT_S:.0f}s")
        time.sleep(poll_s)


def run_mode(
    stack: DevStack, run_dir: Path, mode: str, rounds: int, poll_s: float, run_id: str
) -> tuple[dict[str, Any], KletNode]:
    manifests = run_dir / f"manifests-{mode}"
    manifests.mkdir()
    node = KletNode(
        stack,
        run_dir / f"node-{mode}",
        node_name=f"ev{mode[:3]}{run_id}",
        manifest_dir=manifests,
        extra_flags=MODES[mode],
    )
    node.start()
    pods = [f"death{i}" for i in range(rounds)]
    for pod in pods:
        (manifests / f"{pod}.yaml").write_text(MANIFEST.format(name=pod, image=BUSYBOX_IMAGE))
    for pod in pods:
        poll(
            node,
            pod,
            lambda c: c is not None and "running" in c.get("state", {}) and bool(c.get("ready")),
            0.1,
        )
    death: list[float] = []
    restart: list[float] = []
    for pod in pods:
        c = main_status(node, pod)
        assert c is not None
        pid = task_pid(stack, str(c["containerID"]).removeprefix("containerd://"))
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        death.append(poll(node, pod, died, poll_s) - t0)
        restart.append(poll(node, pod, restarted, poll_s) - t0)
        print(
            f"bench: {mode} {pod}: death {death[-1] * 1000:.0f} ms, "
            f"restarted {restart[-1] * 1000:.0f} ms",
            flush=True,
        )
    return {"death_reported": stats(death), "restarted": stats(restart)}, node


def report(res: dict[str, Any]) -> str:
    lines = [
        f"container death → /pods ({res['rounds']} rounds per mode, "
        f"poll {res['poll_ms']} ms, {res['runtime']})",
        f"{'mode':<9} {'measure':<15} {'median':>9} {'p99':>9} {'min':>9} {'max':>9}",
    ]
    for mode, m in res["modes"].items():
        for what, s in m.items():
            lines.append(
                f"{mode:<9} {what:<15} "
                + " ".join(f"{s[k] * 1000:>6.0f} ms" for k in ("median", "p99", "min", "max"))
            )
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--rounds", type=int, default=20, help="pods killed per mode (default 20)")
    p.add_argument("--poll-ms", type=float, default=10.0, help="/pods poll period (default 10)")
    p.add_argument("--modes", default="evented,relist", help="comma-separated (default both)")
    common.add_keep_and_output(p, RESULTS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if (code := common.begin(root_for="it starts containerd")) is not None:
        return code
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        print(f"bench: unknown mode(s) {unknown}; known: {list(MODES)}", file=sys.stderr)
        return 2
    run_id = uuid.uuid4().hex[:6]
    run_dir = Path(tempfile.mkdtemp(prefix="klet-", dir="/tmp"))
    stack = DevStack(run_dir)
    runner = asyncio.Runner()
    cri: RuntimeClient | None = None
    res: dict[str, Any] = {}
    load_before = common.load()
    try:
        print(f"bench: devstack in {run_dir} ...", flush=True)
        stack.start()
        cri = runner.run(make_client(stack.runtime_endpoint))
        version = runner.run(cri.version())
        runner.run(cri.pull_image(BUSYBOX_IMAGE))
        results: dict[str, Any] = {}
        for mode in modes:
            node: KletNode | None = None
            try:
                print(f"bench: mode {mode}, {args.rounds} pods ...", flush=True)
                results[mode], node = run_mode(
                    stack, run_dir, mode, args.rounds, args.poll_ms / 1000, run_id
                )
            finally:
                if node is not None:
                    cleanup_node(stack, runner, cri, node)
        res = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "rounds": args.rounds,
            "poll_ms": args.poll_ms,
            "runtime": f"{version.runtime_name} {version.runtime_version}",
            "machine": machine(),
            "load_before": load_before,
            "load_after": common.load(),
            "modes": results,
            "units": "seconds",
        }
    finally:
        with common.cleaning_up():
            # the nodes' sandboxes went with their modes (cleanup_node): no node name here
            cleanup(stack, runner, cri, None, run_id, "", run_dir, args.keep)
    common.write_results(args.output, res)
    print(report(res))
    print(f"results: {args.output}")
    return 0


def cleanup_node(
    stack: DevStack, runner: asyncio.Runner, cri: RuntimeClient | None, node: KletNode
) -> None:
    """Stop one mode's node and remove its sandboxes, so the next mode starts clean."""
    node.stop()
    if cri is not None and stack.containerd is not None:
        runner.run(remove_sandboxes(cri, "", node.node_name))


if __name__ == "__main__":
    common.entry(main)

"""Benchmark: how long one container GC pass of the image-gc service takes.

Run with ``make bench-gc`` (``.venv/bin/python bench/gc.py``); the real-containerd part
needs root. Three measurements, each the median of several runs (see bench/README.md):

1. decision: ``containerselect.plan`` alone over the listings of a node holding
   500 dead containers (100 pods, 5 dead instances each) and 200 images;
2. pass on the fake runtime: ``ContainerGC.collect()`` on that node held by
   ``klet.testbed.fakes.cri.FakeRuntimeService`` (in memory: listing, decision, the removal
   calls, the pod log directories on disk), i.e. klet's own cost of a pass;
3. pass on real containerd: a private DevStack, pods made straight through CRI whose
   containers really ran and exited (default 50 pods x 10 dead instances = 500 dead
   containers), then ``ContainerGC.collect()`` through
   ``klet.cri.RuntimeClient`` — listing, ListContainerStats, RemoveContainer,
   Stop/RemovePodSandbox and log directory removal, all real.

In both passes half of the pods are desired (a ready sandbox, one running container:
all dead instances but the newest go) and half are deleted (a stopped sandbox: every
dead container, the sandbox and the log directory go). Writes
``bench/results/gc-latest.json``; everything started is removed on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from klet.cri import CRISettings, RuntimeClient  # noqa: E402
from klet.cri import labels as L  # noqa: E402
from klet.cri.errors import CRIError  # noqa: E402
from klet.cri.types import ContainerConfig, ContainerState, SandboxConfig  # noqa: E402
from klet.devstack import BUSYBOX_IMAGE, DevStack  # noqa: E402
from klet.image_gc.containergc import ContainerGC, ContainerGCResult, ContainerRuntime  # noqa: E402
from klet.image_gc.containerselect import ContainerGCSettings, plan  # noqa: E402
from klet.image_gc.imagegc import ImageGCManager  # noqa: E402
from klet.image_gc.imageselect import FsUsage, ImageGCPolicy  # noqa: E402
from klet.model.records import ImageUseRecord  # noqa: E402
from klet.testbed.fakes.cri import FakeRuntimeService  # noqa: E402

from bench import common  # noqa: E402
from bench.run import machine, summary  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gc-latest.json"
BENCH_LABEL = "klet.bench/gc"  # on every real sandbox, so clean-up finds them
POLL_S = 0.05

log = logging.getLogger("bench.gc")


@dataclass(frozen=True)
class Shape:
    """A node to collect: `pods` pods of one container with `dead` dead instances each."""

    pods: int
    dead: int
    images: int = 0

    @property
    def dead_total(self) -> int:
        return self.pods * self.dead


def sandbox_config(run: str, i: int, logs: Path, attempt: int = 0) -> SandboxConfig:
    uid = f"{run}-{i:04d}"
    log_dir = logs / f"bench_p{i}_{uid}"
    (log_dir / "c").mkdir(parents=True, exist_ok=True)
    (log_dir / "c" / "0.log").write_text("x" * 1024)
    return SandboxConfig(
        name=f"p{i}",
        namespace="bench",
        uid=uid,
        attempt=attempt,
        hostname=f"p{i}",
        log_directory=str(log_dir),
        labels={
            **L.sandbox_labels(name=f"p{i}", namespace="bench", uid=uid, pod_labels={}),
            BENCH_LABEL: run,
        },
    )


def container_config(sandbox: SandboxConfig, attempt: int, image: str, cmd: str) -> ContainerConfig:
    labels = L.container_labels(
        pod_name=sandbox.name, namespace="bench", uid=sandbox.uid, container="c"
    )
    return ContainerConfig(
        name="c",
        attempt=attempt,
        image=image,
        command=("sh", "-c", cmd),
        log_path=f"c/{attempt}.log",
        labels={**labels, BENCH_LABEL: sandbox.labels[BENCH_LABEL]},
    )


def gc_for(runtime: ContainerRuntime, desired: set[str], logs: Path, **kw: Any) -> ContainerGC:
    async def ready() -> bool:
        return True

    async def uids() -> set[str]:
        return desired

    return ContainerGC(
        runtime=runtime,
        settings=ContainerGCSettings(),
        sources_ready=ready,
        desired_uids=uids,
        pod_logs_dir=logs,
        **kw,
    )


# -- the fake runtime ----------------------------------------------------------------------


async def fake_node(shape: Shape, logs: Path) -> tuple[FakeRuntimeService, set[str]]:
    """The node of the module docstring in a FakeRuntimeService; returns it and the desired."""
    cri = FakeRuntimeService()
    images = [
        cri.add_image(f"bench.test/img{j}:1", 1 << 20).repo_tags[0] for j in range(shape.images)
    ]
    images = images or [cri.add_image(BUSYBOX_IMAGE).repo_tags[0]]
    desired: set[str] = set()
    for i in range(shape.pods):
        cfg = sandbox_config("fake", i, logs)
        sid = await cri.run_pod_sandbox(cfg)
        keep = i % 2 == 0
        for attempt in range(shape.dead + (1 if keep else 0)):
            image = images[(i * shape.dead + attempt) % len(images)]
            cid = await cri.create_container(sid, container_config(cfg, attempt, image, ""), cfg)
            await cri.start_container(cid)
            if attempt < shape.dead:
                cri.exit_container(cid, 0)
        if keep:
            desired.add(cfg.uid)
        else:
            await cri.stop_pod_sandbox(sid)
    return cri, desired


async def bench_decision(shape: Shape, runs: int, tmp: Path) -> dict[str, Any]:
    cri, desired = await fake_node(shape, tmp / "decision-logs")
    containers, sandboxes = await cri.list_containers(), await cri.list_pod_sandboxes()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        decided = plan(
            containers,
            sandboxes,
            settings=ContainerGCSettings(),
            desired=desired,
            sources_ready=True,
            now_s=time.time(),
        )
        samples.append(time.perf_counter() - t0)
    out = summary(samples)
    out["containers_removed"] = len(decided.containers)
    out["sandboxes_removed"] = len(decided.sandboxes)
    return out


async def bench_fake_pass(shape: Shape, runs: int, tmp: Path) -> dict[str, Any]:
    samples, last = [], None
    for r in range(runs):
        logs = tmp / f"fake-logs-{r}"
        cri, desired = await fake_node(shape, logs)
        gc = gc_for(cri, desired, logs)
        t0 = time.perf_counter()
        last = await gc.collect()
        samples.append(time.perf_counter() - t0)
    return {**summary(samples), **_counts(last)}


async def bench_image_pass(shape: Shape, runs: int, tmp: Path) -> dict[str, Any]:
    """One image GC pass on the fake node: `shape.images` images of 1 MiB, a quarter of
    them used by the node's containers (dead or alive: in use), the rest never used, on
    a disk 95 % full; policy 85/80 with no minimum age."""
    samples: list[float] = []
    removed = 0
    used = max(1, shape.images // 4)
    for r in range(runs):
        cri, _desired = await fake_node(replace(shape, images=used), tmp / f"image-logs-{r}")
        for j in range(used, shape.images):
            cri.add_image(f"bench.test/unused{j}:1", 1 << 20)
        total = sum(i.size for i in cri.images.values())
        capacity = int(total / 0.95)

        async def usage(cri: FakeRuntimeService = cri, capacity: int = capacity) -> FsUsage:
            used = sum(i.size for i in cri.images.values())
            return FsUsage(capacity=capacity, available=capacity - used)

        async def ready() -> bool:
            return True

        async def pause() -> str:
            return ""

        manager = ImageGCManager(
            cri,
            policy=ImageGCPolicy(high_threshold_percent=85, low_threshold_percent=80, min_age_s=0),
            fs_stats=usage,
            sandbox_image=pause,
            store=MemoryStore(),
            events=lambda *_event: None,
            sources_ready=ready,
        )
        t0 = time.perf_counter()
        result = await manager.garbage_collect()
        samples.append(time.perf_counter() - t0)
        removed = result.images_removed
    return {**summary(samples), "images_removed": removed}


class MemoryStore:
    """The `images` table of the bus, in memory."""

    def __init__(self) -> None:
        self.records: dict[str, ImageUseRecord] = {}

    async def load(self) -> dict[str, ImageUseRecord]:
        return dict(self.records)

    async def save(self, changed: Sequence[ImageUseRecord], removed: Sequence[str]) -> None:
        self.records.update({r.id: r for r in changed})
        for image_id in removed:
            self.records.pop(image_id, None)


# -- real containerd -----------------------------------------------------------------------


async def real_node(cri: RuntimeClient, shape: Shape, run: str, logs: Path) -> tuple[set[str], int]:
    """Pods straight through CRI whose containers ran and exited; the desired and the
    number of containers made."""
    sem = asyncio.Semaphore(4)
    desired: set[str] = set()

    async def one(i: int) -> int:
        async with sem:
            cfg = sandbox_config(run, i, logs)
            sid = await cri.run_pod_sandbox(cfg)
            keep = i % 2 == 0
            made = 0
            for attempt in range(shape.dead + (1 if keep else 0)):
                last = attempt == shape.dead
                cmd = "exec sleep 3600" if last else "exit 0"
                cid = await cri.create_container(
                    sid, container_config(cfg, attempt, BUSYBOX_IMAGE, cmd), cfg
                )
                await cri.start_container(cid)
                made += 1
            if keep:
                desired.add(cfg.uid)
            return made

    made = sum(await asyncio.gather(*(one(i) for i in range(shape.pods))))

    async def all_exited() -> bool:
        cs = await cri.list_containers(label_selector={BENCH_LABEL: run})
        return sum(c.state == ContainerState.EXITED for c in cs) >= shape.dead_total

    await poll(all_exited, "the containers to exit")
    for s in await cri.list_pod_sandboxes(label_selector={BENCH_LABEL: run}):
        if s.uid not in desired:
            await cri.stop_pod_sandbox(s.id)
    return desired, made


async def poll(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def bench_real_pass(
    endpoint: str, shape: Shape, runs: int, tmp: Path, run_id: str
) -> dict[str, Any]:
    cri = RuntimeClient(CRISettings(runtime_endpoint=endpoint, timeout_s=60))
    samples, per_container, last = [], [], None
    try:
        await cri.pull_image(BUSYBOX_IMAGE)
        for r in range(runs):
            run = f"{run_id}{r}"
            logs = tmp / f"real-logs-{r}"
            t0 = time.perf_counter()
            desired, made = await real_node(cri, shape, run, logs)
            print(
                f"  run {r + 1}/{runs}: {made} containers made in "
                f"{time.perf_counter() - t0:.1f} s, collecting ...",
                flush=True,
            )
            gc = gc_for(cri, desired, logs, stats=cri)
            t0 = time.perf_counter()
            last = await gc.collect()
            took = time.perf_counter() - t0
            samples.append(took)
            per_container.append(took / max(1, last.containers_removed))
            print(f"  run {r + 1}/{runs}: pass {took * 1000:.0f} ms, {_counts(last)}", flush=True)
            await remove_sandboxes(cri, run)
    finally:
        await remove_sandboxes(cri, run_id)
        await cri.close()
    return {**summary(samples), "per_container_removed": summary(per_container), **_counts(last)}


async def remove_sandboxes(cri: RuntimeClient, run_prefix: str) -> None:
    for s in await cri.list_pod_sandboxes():
        if s.labels.get(BENCH_LABEL, "").startswith(run_prefix):
            try:
                await cri.stop_pod_sandbox(s.id)
                await cri.remove_pod_sandbox(s.id)
            except CRIError as err:
                print(f"bench: could not remove sandbox {s.id[:12]}: {err}", file=sys.stderr)


def _counts(result: ContainerGCResult | None) -> dict[str, Any]:
    if result is None:
        return {}
    return {
        "containers_removed": result.containers_removed,
        "sandboxes_removed": result.sandboxes_removed,
        "log_dirs_removed": result.log_dirs_removed,
        "bytes_freed": result.bytes_freed,
        "errors": result.errors,
    }


# -- main ----------------------------------------------------------------------------------


def fmt(label: str, s: dict[str, Any]) -> str:
    if not s.get("n"):
        return f"{label:<52} (no samples)"
    cells = "".join(f"{s[k] * 1000:>10.2f}" for k in ("median", "p90", "min", "max"))
    return f"{label:<52}{s['n']:>4}{cells}"


def report(res: dict[str, Any]) -> str:
    m = res["measurements"]
    fake, real = res["fake_shape"], res["real_shape"]
    lines = [
        "",
        f"klet container GC bench  {res['date']}  nproc={res['machine']['nproc']}  "
        f"load avg before={res['load_before']}  after={res['load_after']}",
        f"commit {res['machine']['commit']}"
        f"{' (dirty worktree)' if res['machine']['worktree_dirty'] else ''}",
        "",
        f"{'measurement (ms)':<52}{'n':>4}{'median':>10}{'p90':>10}{'min':>10}{'max':>10}",
        fmt(f"decision: {fake['dead_total']} dead, {fake['images']} images", m["decision"]),
        fmt(f"pass, fake CRI: {fake['dead_total']} dead, {fake['images']} images", m["fake_pass"]),
        fmt(f"image GC pass, fake CRI: {fake['images']} images", m["image_pass"]),
        f"image GC pass removed {m['image_pass']['images_removed']} images",
    ]
    if "real_pass" in m:
        lines.append(fmt(f"pass, real containerd: {real['dead_total']} dead", m["real_pass"]))
        lines.append(fmt("  per container removed", m["real_pass"]["per_container_removed"]))
    for key in ("decision", "fake_pass", "real_pass"):
        if key in m:
            s = m[key]
            lines.append(
                f"{key}: removed {s['containers_removed']} containers, "
                f"{s['sandboxes_removed']} sandboxes"
                + (
                    f", {s['log_dirs_removed']} log dirs, {s['bytes_freed']} bytes, "
                    f"{s['errors']} errors"
                    if "log_dirs_removed" in s
                    else ""
                )
            )
    lines.append(f"total run time {res['run_seconds']:.1f} s")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = common.parser(__doc__)
    p.add_argument("--pods", type=int, default=100, help="pods of the fake node (default 100)")
    p.add_argument("--dead", type=int, default=5, help="dead instances per pod (default 5)")
    p.add_argument("--images", type=int, default=200, help="images of the fake node (default 200)")
    p.add_argument("--runs", type=int, default=5, help="runs of each fake measurement (default 5)")
    p.add_argument("--real-pods", type=int, default=50, help="pods on containerd (default 50)")
    p.add_argument(
        "--real-dead",
        type=int,
        default=10,
        help="dead instances per pod on containerd (default 10)",
    )
    p.add_argument("--real-runs", type=int, default=3, help="real passes (default 3)")
    p.add_argument("--no-real", action="store_true", help="skip real containerd (no root needed)")
    common.add_keep_and_output(p, RESULTS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root_for = None if args.no_real else "the real containerd part; or pass --no-real"
    if (code := common.begin(root_for=root_for)) is not None:
        return code
    began = time.perf_counter()
    run_id = uuid.uuid4().hex[:6]
    fake = Shape(args.pods, args.dead, args.images)
    real = Shape(args.real_pods, args.real_dead)
    tmp = Path(tempfile.mkdtemp(prefix="klet-gc-", dir="/tmp"))
    load_before = common.load()
    m: dict[str, Any] = {}
    stack: DevStack | None = None
    try:
        print(f"bench: decision over {fake.dead_total} dead containers ...", flush=True)
        m["decision"] = asyncio.run(bench_decision(fake, args.runs * 4, tmp))
        print(f"bench: pass on the fake runtime, {args.runs} runs ...", flush=True)
        m["fake_pass"] = asyncio.run(bench_fake_pass(fake, args.runs, tmp))
        print(f"bench: image GC pass on the fake runtime, {args.runs} runs ...", flush=True)
        m["image_pass"] = asyncio.run(bench_image_pass(fake, args.runs, tmp))
        if not args.no_real:
            stack = DevStack(tmp / "stack")
            print(f"bench: devstack in {tmp / 'stack'} ...", flush=True)
            stack.start()
            print(f"bench: pass on containerd, {args.real_runs} runs ...", flush=True)
            m["real_pass"] = asyncio.run(
                bench_real_pass(stack.runtime_endpoint, real, args.real_runs, tmp, run_id)
            )
    finally:
        with common.cleaning_up():
            steps = [("stop devstack", stack.stop)] if stack is not None else []
            common.run_steps(steps, run_dir=tmp, keep=args.keep)

    res = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fake_shape": {**vars(fake), "dead_total": fake.dead_total},
        "real_shape": {**vars(real), "dead_total": real.dead_total},
        "machine": machine(),
        "load_before": load_before,
        "load_after": common.load(),
        "measurements": m,
        "run_seconds": time.perf_counter() - began,
        "units": "seconds",
    }
    common.write_results(args.output, res)
    print(report(res))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    common.entry(main)

"""Image GC on real containerd with a small image filesystem (containerd's root on a
96 MiB tmpfs), padded images from the project's builder pulled from the local registry,
and the image-gc service run as a process by KletNode:

- crossing imageGCHighThresholdPercent makes a pass remove unused images least recently
  used first (a never-used image before used ones, then by last use) and stop once the
  low threshold is reached; it never removes an image a running pod uses, the sandbox
  (pause) image, or an image younger than imageMinimumGCAge, even when it is the least
  recently used; `kubelet_image_garbage_collected_total{reason="space"}` counts them;
- FreeSpace over the GarbageCollector socket removes in the same order until the asked
  bytes are reached and the image filesystem really gains at least what it reports;
- the first-detected and last-used times are in the bus's `images` table.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from klet.bus import NodeBus
from klet.cri import CRISettings, RuntimeClient
from klet.cri import labels as L
from klet.devstack import DevStack
from klet.devstack.images import PAUSE_IMAGE, TEST_REGISTRY_HOST, ImageSpec
from klet.model.layout import IMAGE_GC, grpc_socket
from klet.rpc.gc import CollectResult, GarbageCollectorClient

from tests.harness.node import KletNode, fetch, sample_value
from tests.harness.pods import running
from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods

T = TypeVar("T")

MIB = 1 << 20
ROOT_SIZE = 96 * MIB
HIGH, LOW = 73, 63
MIN_AGE_S = 10
# Each image: busybox (~2 MB) plus 4 MiB of incompressible padding; containerd reports
# ~6 MiB and keeps ~12 MiB on disk (the layer blob and its unpacked snapshot).
PADDING = 4 * MIB
NAMES = ("never", "lru1", "lru2", "lru3", "inuse", "young")


def ref(name: str) -> str:
    return f"{TEST_REGISTRY_HOST}/gc-{name}:1"


@pytest.fixture(scope="module")
def small_stack() -> Iterator[DevStack]:
    """A DevStack of this module's own whose containerd root is a 96 MiB tmpfs."""
    dir = Path(tempfile.mkdtemp(prefix="klet-gc-", dir="/tmp"))
    stack = DevStack(dir, containerd_root_size=ROOT_SIZE)
    stack.start()
    try:
        for name in NAMES:
            stack.add_image(
                ImageSpec(
                    name=ref(name).rpartition(":")[0], tag="1", cmd=["sh"], padding_bytes=PADDING
                )
            )
        yield stack
    finally:
        stack.stop()
        if not os.environ.get("KLET_KEEP_DEVSTACK"):
            shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture
def gc_node(small_stack: DevStack, tmp_path: Path) -> Iterator[tuple[KletNode, Path]]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    node = KletNode(
        small_stack,
        tmp_path / "n",
        node_name="gcnode",
        manifest_dir=manifests,
        extra_flags=[
            "--image-gc-high-threshold",
            str(HIGH),
            "--image-gc-low-threshold",
            str(LOW),
            "--minimum-image-ttl-duration",
            f"{MIN_AGE_S}s",
        ],
    )
    try:
        yield node, manifests
    finally:
        node.stop()
        asyncio.run(remove_node_pods(small_stack.runtime_endpoint, node.node_name))
        node.release_mounts()


def pod(name: str, image: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {image}
      command: ["sleep", "100000"]
"""


def cri_call(stack: DevStack, fn: Callable[[RuntimeClient], Awaitable[T]]) -> T:
    async def go() -> T:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=60))
        try:
            return await fn(cri)
        finally:
            await cri.close()

    return asyncio.run(go())


def images_present(stack: DevStack) -> dict[str, int]:
    """tag -> size the runtime reports."""

    async def go(cri: RuntimeClient) -> dict[str, int]:
        return {t: i.size for i in await cri.list_images() for t in i.repo_tags}

    return cri_call(stack, go)


def pull(stack: DevStack, *refs: str) -> None:
    async def go(cri: RuntimeClient) -> None:
        for r in refs:
            await cri.pull_image(r)

    cri_call(stack, go)


def pod_containers(stack: DevStack, full_name: str) -> int:
    async def go(cri: RuntimeClient) -> int:
        return len(await cri.list_containers(label_selector={L.POD_NAME: full_name}))

    return cri_call(stack, go)


def fs(stack: DevStack) -> tuple[int, int]:
    """(capacity, available) of the image filesystem."""
    assert stack.containerd is not None
    st = os.statvfs(stack.containerd.root)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def gc_client(node: KletNode) -> GarbageCollectorClient:
    return GarbageCollectorClient(grpc_socket(node.dir / "run", IMAGE_GC), timeout_s=60)


def collect_now(node: KletNode) -> CollectResult:
    async def go() -> CollectResult:
        client = gc_client(node)
        try:
            return await client.collect_now()
        finally:
            await client.close()

    return asyncio.run(go())


def run_then_delete(node: KletNode, manifests: Path, stack: DevStack, name: str) -> None:
    """Run a pod from gc-<name>, let image GC see it in use, then delete the pod."""
    (manifests / f"{name}.yaml").write_text(pod(name, ref(name)))
    wait_for(lambda: running(node, name), timeout_s=60, what=f"pod {name} Running")
    collect_now(node)  # a detection while the container exists: last used = now
    (manifests / f"{name}.yaml").unlink()
    full = f"{name}-{node.node_name}"
    wait_for(
        lambda: pod_containers(stack, full) == 0,
        timeout_s=60,
        what=f"the containers of {full} removed",
    )


def gc_metric(node: KletNode, reason: str) -> float:
    prefix = f'kubelet_image_garbage_collected_total{{reason="{reason}"}} '
    for line in node.metrics("image-gc").splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def test_image_gc_on_a_small_image_filesystem(
    gc_node: tuple[KletNode, Path], small_stack: DevStack
) -> None:
    node, manifests = gc_node
    stack = small_stack
    node.start()
    sock = grpc_socket(node.dir / "run", IMAGE_GC)
    wait_for(sock.exists, timeout_s=30, what="the GarbageCollector socket")
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    # Ready means acting: the lease held, GarbageCollector served, images detected once.
    readyz = f"http://127.0.0.1:{node.ports['image-gc']}/readyz"
    wait_for(lambda: fetch(readyz) == "ok", timeout_s=60, what="image-gc ready")
    page = fetch(f"http://127.0.0.1:{node.ports['image-gc']}/metrics")
    assert sample_value(page, "klet_leader", service="image-gc") == 1.0
    assert (sample_value(page, "klet_image_gc_images") or 0) > 0  # the pause image at least

    pull(stack, *(ref(n) for n in ("never", "lru1", "lru2", "lru3", "inuse")))
    first_detection = time.monotonic()
    assert collect_now(node).images_removed == 0  # below the high threshold: detection only
    (manifests / "inuse.yaml").write_text(pod("inuse", ref("inuse")))
    wait_for(lambda: running(node, "inuse"), timeout_s=60, what="pod inuse Running")
    for name in ("lru1", "lru2", "lru3"):
        run_then_delete(node, manifests, stack, name)
    # Every image detected so far is older than the minimum age before the pass.
    wait_for(
        lambda: time.monotonic() - first_detection > MIN_AGE_S + 1,
        timeout_s=MIN_AGE_S + 5,
        what="the first detection to be older than imageMinimumGCAge",
    )
    pull(stack, ref("young"))  # pushes usage over the high threshold; detected by the pass
    sizes = images_present(stack)
    capacity, available = fs(stack)
    usage = 100 - available * 100 // capacity
    target = capacity * (100 - LOW) // 100 - available
    size = sizes[ref("never")]
    assert usage >= HIGH, f"setup: image fs at {usage}%, below the high threshold {HIGH}%"
    assert 2 * size < target <= 3 * size, (
        f"setup: the pass must free {target} bytes, not between 2 and 3 images of {size}"
    )

    result = collect_now(node)

    after = images_present(stack)
    gone = set(sizes) - set(after)
    # Least recently used first: "never" (never used), then lru1 and lru2; lru3 stays
    # because three images reach the target. "young" was the least recently used of
    # all (never used) but is younger than the minimum age.
    assert gone == {ref("never"), ref("lru1"), ref("lru2")}, f"removed: {sorted(gone)}"
    assert {PAUSE_IMAGE, ref("inuse"), ref("lru3"), ref("young")} <= set(after)
    assert result.images_removed == 3
    assert result.bytes_freed >= sum(sizes[r] for r in gone)
    capacity, available = fs(stack)
    assert 100 - available * 100 // capacity <= LOW
    assert gc_metric(node, "space") == 3.0
    assert running(node, "inuse")

    # The times are on the bus: lru3 was last used after it was first detected.
    async def table() -> dict[str, tuple[float, float]]:
        bus = node.bus(service="image-gc")
        try:
            rows = await NodeBus.of(bus, service="image-gc").images.all()
            return {k: (r.first_detected, r.last_used) for k, r in rows.items()}
        finally:
            await bus.close()

    async def lru3_id(cri: RuntimeClient) -> str:
        info = await cri.image_status(ref("lru3"))
        assert info is not None
        return info.id

    rows = asyncio.run(table())
    lru3 = rows[cri_call(stack, lru3_id)]
    assert lru3[1] > lru3[0] > 0

    # FreeSpace: once "young" is old enough it is the least recently used (never used),
    # then lru3; asking for a little more than one image takes exactly those two.
    young_detected = time.monotonic()
    wait_for(
        lambda: time.monotonic() - young_detected > MIN_AGE_S + 1,
        timeout_s=MIN_AGE_S + 5,
        what="young to be older than imageMinimumGCAge",
    )
    before_available = fs(stack)[1]

    async def free() -> tuple[int, int, int]:
        client = gc_client(node)
        try:
            r = await client.free_space(sizes[ref("young")] + 1)
            return r.bytes_freed, r.containers_removed, r.images_removed
        finally:
            await client.close()

    freed, _containers, removed = asyncio.run(free())
    after_free = images_present(stack)
    assert set(after) - set(after_free) == {ref("young"), ref("lru3")}
    assert removed == 2
    assert freed >= sizes[ref("young")] + sizes[ref("lru3")]
    assert fs(stack)[1] - before_available >= freed  # the disk gained what was reported
    assert {PAUSE_IMAGE, ref("inuse")} <= set(after_free)
    assert gc_metric(node, "space") == 5.0

"""The eviction signals measured on the real host and the harness's real containerd.

- memory.available agrees with the kernel's own estimate (/proc/meminfo MemAvailable)
  and falls when a process the test starts touches memory;
- nodefs on a small tmpfs the test mounts as the root dir: capacity and inodes are the
  mount's, and writing a file moves available bytes and free inodes by exactly what
  `df` sees; the image filesystem is then on another device (a dedicated imagefs);
- imagefs is the filesystem of the mountpoint containerd's ImageFsInfo names (under
  containerd's root): on a containerd of the test's own whose root is a small tmpfs
  (nothing else writes there, however busy the host's disk) it agrees with `df` and
  moves by exactly what the test writes; containerfs follows it (containerd 1.6 does
  not split them), and the layout is a dedicated image filesystem. The devstack's
  containerd, on the host's disk with the root dir, is one shared filesystem (sizes
  only: what that disk has free is other processes' to change);
- pid.available is pid_max minus the tasks running, and moves when the test forks;
- a real pod's usage: its pod cgroup's working set and tasks, its disk emptyDir (a
  `medium: Memory` one counts as memory, not disk), its container's log and the
  container's working set (CRI's, else its own cgroup's).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.config.kubelet import KubeletConfiguration
from klet.config.settings import KletSettings, Settings
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import PAUSE_IMAGE, Containerd, DevStack
from klet.eviction.hostsignals import FsLayout, HostSignalSource
from klet.eviction.signals import Observations, PodUsage, Signal

from tests.harness.node import KletNode
from tests.harness.pods import running
from tests.harness.waiting import wait_for

Mi = 2**20
IMAGE = "registry.klet.test/busybox:1.36"


def settings(root_dir: Path, logs_dir: Path) -> Settings:
    return Settings(
        kubelet=KubeletConfiguration(pod_logs_dir=str(logs_dir)),
        klet=KletSettings(service="eviction", node_name="eviction-signals", root_dir=root_dir),
    )


def observe(
    runtime_endpoint: str, root_dir: Path, logs_dir: Path | None = None
) -> tuple[Observations, dict[str, PodUsage], FsLayout]:
    """One pass of the adapter against the containerd at `runtime_endpoint`."""

    async def go() -> tuple[Observations, dict[str, PodUsage], FsLayout]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=runtime_endpoint, timeout_s=30))
        try:
            source = HostSignalSource.from_settings(
                settings(root_dir, logs_dir or root_dir / "logs"), cri
            )
            observed, pods = await source.observe()
            return observed, pods, await source.fs_layout()
        finally:
            await cri.close()

    return asyncio.run(go())


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


def df(path: Path) -> tuple[int, int, int, int]:
    """(size, available bytes, inodes, free inodes) as `df` reports them."""
    out = subprocess.run(
        ["df", "-B1", "--output=size,avail", str(path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()[1]
    inodes = subprocess.run(
        ["df", "--output=itotal,iavail", str(path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()[1]
    size, avail = map(int, out.split())
    itotal, iavail = map(int, inodes.split())
    return size, avail, itotal, iavail


def test_memory_available_agrees_with_meminfo_and_falls_when_memory_is_used(
    devstack: DevStack, tmp_path: Path
) -> None:
    before = meminfo()
    observed, _pods, _layout = observe(devstack.runtime_endpoint, tmp_path)
    after = meminfo()
    memory = observed[Signal.MEMORY_AVAILABLE]
    assert memory.capacity == before["MemTotal"]
    kernel = (before["MemAvailable"] + after["MemAvailable"]) // 2
    # The working set counts active file pages as used and leaves kernel memory (slab,
    # ...) out of the root cgroup's usage; MemAvailable counts file pages and half the
    # reclaimable slab as available. They differ by at most those, plus noise.
    margin = max(before["Active(file)"], after["Active(file)"]) + before["Slab"]
    margin += memory.capacity // 20
    assert abs(memory.available - kernel) <= margin, (memory, kernel, margin)

    size = min(512 * Mi, kernel // 4)
    program = (
        f"import sys; b = bytearray(b'x') * {size}; print('ready', flush=True); sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as hog:
        try:
            assert hog.stdout is not None and hog.stdout.readline().strip() == "ready"
            held, _pods, _layout = observe(devstack.runtime_endpoint, tmp_path)
            drop = memory.available - held[Signal.MEMORY_AVAILABLE].available
            assert drop >= size // 2, (drop, size)
        finally:
            hog.kill()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs with 1000 inodes, unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,nr_inodes=1000", "tmpfs", str(mount)],
        check=True,
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_nodefs_on_a_small_filesystem_moves_when_a_file_is_written(
    devstack: DevStack, small_fs: Path
) -> None:
    root = small_fs / "kubelet"
    root.mkdir()
    observed, _pods, layout = observe(devstack.runtime_endpoint, root)
    space, inodes = observed[Signal.NODEFS_AVAILABLE], observed[Signal.NODEFS_INODES_FREE]
    size, avail, itotal, iavail = df(small_fs)
    assert (space.capacity, space.available) == (16 * Mi, avail) and size == 16 * Mi
    assert (inodes.capacity, inodes.available) == (itotal, iavail) == (1000, iavail)
    # containerd keeps its images elsewhere: a dedicated image filesystem
    assert layout == FsLayout(dedicated_image_fs=True, split_container_fs=False)

    (root / "blob").write_bytes(b"\0" * (4 * Mi))
    after, _pods, _layout = observe(devstack.runtime_endpoint, root)
    assert space.available - after[Signal.NODEFS_AVAILABLE].available == 4 * Mi
    assert inodes.available - after[Signal.NODEFS_INODES_FREE].available == 1
    assert after[Signal.NODEFS_AVAILABLE].available == df(small_fs)[1]


def image_fs_mountpoint(runtime_endpoint: str) -> Path:
    """The mountpoint containerd's ImageFsInfo names."""

    async def go() -> str:
        cri = RuntimeClient(CRISettings(runtime_endpoint=runtime_endpoint, timeout_s=30))
        try:
            images, _containers = await cri.image_fs_info()
            return images[0].mountpoint
        finally:
            await cri.close()

    return Path(asyncio.run(go()))


IMAGE_FS_SIZE = 64 * Mi


@pytest.fixture
def private_containerd(devstack: DevStack, tmp_path: Path) -> Iterator[Containerd]:
    """A containerd of this test alone whose root (images, snapshots) is a tmpfs of
    IMAGE_FS_SIZE: nothing but it and the test writes there, so what the image
    filesystem has free is the test's to change, however busy the host's disk is."""
    containerd = Containerd.for_registry(
        tmp_path / "containerd",
        devstack.registry_address,
        sandbox_image=PAUSE_IMAGE,
        root_size_bytes=IMAGE_FS_SIZE,
    )
    containerd.start()
    try:
        yield containerd
    finally:
        containerd.stop()


def test_imagefs_is_containerds_image_filesystem(
    private_containerd: Containerd, tmp_path: Path
) -> None:
    endpoint = private_containerd.endpoint
    mountpoint = image_fs_mountpoint(endpoint)
    assert mountpoint.is_relative_to(private_containerd.root), mountpoint
    root = tmp_path / "kubelet"
    root.mkdir()

    observed, _pods, layout = observe(endpoint, root)
    space = observed[Signal.IMAGEFS_AVAILABLE]
    size, avail, itotal, _iavail = df(mountpoint)
    assert (space.capacity, space.available) == (IMAGE_FS_SIZE, avail) and size == IMAGE_FS_SIZE
    assert observed[Signal.IMAGEFS_INODES_FREE].capacity == itotal
    # containerd 1.6 does not split them: containerfs is the same filesystem
    assert observed[Signal.CONTAINERFS_AVAILABLE] == space
    # the root dir is on the host's disk: the image filesystem is a dedicated one
    assert layout == FsLayout(dedicated_image_fs=True, split_container_fs=False)

    # filling that filesystem moves imagefs.available by exactly what was written
    (private_containerd.root / "eviction-test-filler").write_bytes(b"\1" * (16 * Mi))
    filled, _pods, _layout = observe(endpoint, root)
    assert space.available - filled[Signal.IMAGEFS_AVAILABLE].available == 16 * Mi
    assert filled[Signal.IMAGEFS_AVAILABLE].available == df(mountpoint)[1]


def test_imagefs_on_the_root_dirs_filesystem_is_not_dedicated(
    devstack: DevStack, tmp_path: Path
) -> None:
    """The devstack's containerd keeps its root on the host's disk, as the test's root
    dir: one shared filesystem. (Only sizes are compared here: other processes write to
    that disk, so what it has free is not the test's to predict.)"""
    assert devstack.containerd is not None
    mountpoint = image_fs_mountpoint(devstack.runtime_endpoint)
    assert mountpoint.is_relative_to(devstack.containerd.root), mountpoint
    if os.stat(tmp_path).st_dev != os.stat(mountpoint).st_dev:
        pytest.skip("the test's root dir is not on containerd's filesystem here")
    observed, _pods, layout = observe(devstack.runtime_endpoint, tmp_path)
    size, _avail, itotal, _iavail = df(mountpoint)
    assert observed[Signal.IMAGEFS_AVAILABLE].capacity == size
    assert observed[Signal.IMAGEFS_INODES_FREE].capacity == itotal
    assert observed[Signal.CONTAINERFS_AVAILABLE].capacity == size
    assert observed[Signal.NODEFS_AVAILABLE].capacity == size
    assert layout == FsLayout(dedicated_image_fs=False, split_container_fs=False)


def test_pid_available_moves_when_processes_are_forked(devstack: DevStack, tmp_path: Path) -> None:
    observed, _pods, _layout = observe(devstack.runtime_endpoint, tmp_path)
    pids = observed[Signal.PID_AVAILABLE]
    assert pids.capacity == int(Path("/proc/sys/kernel/pid_max").read_text())
    children = [subprocess.Popen(["sleep", "120"]) for _ in range(60)]
    try:
        forked, _pods, _layout = observe(devstack.runtime_endpoint, tmp_path)
        assert pids.available - forked[Signal.PID_AVAILABLE].available >= 45
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait(timeout=30)
    reaped, _pods, _layout = observe(devstack.runtime_endpoint, tmp_path)
    assert reaped[Signal.PID_AVAILABLE].available - forked[Signal.PID_AVAILABLE].available >= 45


USER = f"""
apiVersion: v1
kind: Pod
metadata: {{name: user}}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
    - {{name: scratch, emptyDir: {{}}}}
    - {{name: mem, emptyDir: {{medium: Memory}}}}
  containers:
    - name: main
      image: {IMAGE}
      command:
        - sh
        - -c
        - >-
          dd if=/dev/zero of=/scratch/blob bs=1M count=8 &&
          dd if=/dev/zero of=/mem/blob bs=1M count=24 &&
          echo written && sleep 100000 & sleep 100000 & wait
      volumeMounts:
        - {{name: scratch, mountPath: /scratch}}
        - {{name: mem, mountPath: /mem}}
"""


def test_pod_usage_of_a_real_pod(devstack: DevStack, node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "user.yaml").write_text(USER)
    pod = wait_for(lambda: running(node, "user"), timeout_s=60, what="user Running")
    uid = pod["metadata"]["uid"]

    def usage() -> PodUsage | None:
        _observed, pods, _layout = observe(devstack.runtime_endpoint, node.root_dir, node.logs_dir)
        found = pods.get(uid)
        if found is None or found.volumes.get("scratch", 0) < 8 * Mi or found.logs == 0:
            return None
        return found

    found = wait_for(usage, timeout_s=60, what="the pod's usage with its files written")
    assert (found.namespace, found.name) == ("default", f"user-{node.node_name}")
    assert list(found.volumes) == ["scratch"]  # the Memory emptyDir is a tmpfs, not disk
    assert 8 * Mi <= found.volumes["scratch"] < 9 * Mi
    assert found.ephemeral_storage == found.writable_layer + found.logs + found.volumes["scratch"]
    assert found.memory_working_set >= 24 * Mi  # tmpfs pages are charged to the pod
    assert set(found.containers) == {"main"}
    # the pod cgroup's tasks, counted from outside: pause, sh and two sleeps at least
    cgroup = next(
        p
        for p in Path("/sys/fs/cgroup/pids/kubepods").rglob(f"pod{uid}")
        if (p / "pids.current").exists()
    )
    assert found.processes == int((cgroup / "pids.current").read_text()) >= 4

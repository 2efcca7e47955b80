"""Node-pressure eviction on real containerd, with real pressure, seen from outside.

Static pods are critical (upstream's IsCriticalPod) and never evicted, so these pods are
apiserver pods: the test plays pod-source's api source and writes them to the bus as
pod-source would (desired entry, `kubernetes.io/config.source: api`, the `api` source
ready, a `pods` stream entry); syncloop, status-reporter and the eviction service run
as processes. Thresholds are set from a measurement taken at the start of each test:

- memory: the pressure comes from the pods alone, never from the rest of the machine
  (other processes on a busy machine must not keep the node under pressure). The
  threshold is `allocatableMemory.available` (upstream's twin of each hard
  `memory.available` threshold, measured on the pods' kubepods cgroup), with
  systemReserved chosen so that the pods may grow by only 400Mi more before it is
  crossed; `memory.available` itself gets a threshold of 1000Mi the machine is far
  from. The node has a cgroupRoot of its own, so its kubepods cgroup holds its pods
  alone, and enforceNodeAllocatable [pods] caps it at allocatable, the threshold
  (1000Mi) above where eviction begins. A pod that holds ~800Mi (busybox `tail`
  buffering /dev/zero) is Evicted within two monitoring intervals (Failed, reason
  Evicted, upstream's message naming its container, the DisruptionTarget condition, a
  Warning Event), the pod within its requests survives, MemoryPressure appears in the
  bus `node` table and clears after the (shortened) transition period, even while
  the test process itself holds more memory than the pods' headroom;
  `kubelet_evictions` counts it under allocatableMemory.available. The time from the
  threshold being crossed to the pod being killed is printed;
- persistent memory pressure (a system-critical pod holds the memory, so it is never
  evicted): the BestEffort pod is evicted once; a restarted eviction service does not
  evict it again (one Event, the same status); a new BestEffort pod is rejected by
  admission with reason Evicted and "The node had condition: [MemoryPressure]. " while
  a Burstable one is admitted;
- disk: the node's root dir is a small tmpfs; a pod writing to its emptyDir crosses
  `nodefs.available` and is evicted (its emptyDir is torn down, so the pressure
  clears), the calm pod survives, a new pod is rejected under DiskPressure;
- image-gc down: with the root dir on the same filesystem as the images, the disk
  pressure is reclaimed first through FreeSpace, which cannot be reached; the eviction
  still happens;
- reclaim first, with image-gc running (a DevStack of this module whose containerd root,
  the image filesystem, is a small tmpfs): an `imagefs.available` threshold just above
  what is free is answered by FreeSpace removing the unused images (gone from CRI) and
  nothing is evicted; a pod then filling its writable layer crosses it again, FreeSpace
  has nothing left, and that pod is evicted while the calm pod survives;
- PIDs: a lowered `pid.available` threshold and a pod forking hundreds of processes: it
  is evicted, PIDPressure appears.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from klet.bus import NodeBus
from klet.cgroups import CgroupFS
from klet.cgroups.machine import parse_meminfo
from klet.cri import CRISettings, RuntimeClient
from klet.devstack import DevStack
from klet.devstack.images import TEST_REGISTRY_HOST, ImageSpec
from klet.eviction.ranking import format_count
from klet.model.records import DesiredPod, PodChange, SourceState
from klet.model.types import JSON, PodUID

from tests.harness.node import EVICTION_PASSES, KletNode, bus_events, why_story
from tests.harness.waiting import wait_for
from tests.integration.conftest import remove_node_pods

MI = 1024**2
IMAGE = "registry.klet.test/busybox:1.36"
SERVICES = ("syncloop", "status-reporter", "eviction")
MONITORING_S = 10.0  # upstream's evictionMonitoringPeriod


# -- the api source, played by the test ---------------------------------------------------


def api_pod(
    node: KletNode,
    name: str,
    *,
    command: list[str],
    requests: dict[str, str] | None = None,
    priority: int | None = None,
    volumes: list[JSON] | None = None,
    mounts: list[JSON] | None = None,
) -> JSON:
    uid = str(uuid.uuid4())
    container: JSON = {"name": name, "image": IMAGE, "command": command}
    if requests:
        container["resources"] = {"requests": requests}
    if mounts:
        container["volumeMounts"] = mounts
    spec: JSON = {
        "nodeName": node.node_name,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    if priority is not None:
        spec["priority"] = priority
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "creationTimestamp": datetime.now().astimezone().strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {"kubernetes.io/config.source": "api"},
        },
        "spec": spec,
    }


def publish(node: KletNode, *pods: JSON) -> None:
    """Write pods as pod-source's api source does: desired entries, the source ready,
    one `pods` stream entry each."""

    async def go() -> None:
        bus = node.bus(service="pod-source")
        try:
            nb = NodeBus.of(bus, service="eviction")
            async with bus.transaction() as tx:
                for p in pods:
                    uid = PodUID(p["metadata"]["uid"])
                    rec = DesiredPod(uid=uid, pod=p, source="api", hash=uid, seen_at=time.time())
                    tx.put(nb.desired, uid, rec)
                    tx.publish(nb.pods, PodChange(op="ADD", uid=uid, source="api"))
                tx.put(nb.sources, "api", SourceState(source="api", ready=True, at=time.time()))
        finally:
            await bus.close()

    asyncio.run(go())


def node_conditions(node: KletNode) -> dict[str, str]:
    """The eviction service's node conditions on the bus (`node:eviction`): type -> status."""

    async def go() -> dict[str, str]:
        bus = node.bus(service="eviction")
        try:
            rows = await NodeBus.of(bus, service="eviction").conditions.all()
        finally:
            await bus.close()
        return {r.type: r.status for r in rows.values()}

    return asyncio.run(go())


def phase(node: KletNode, name: str) -> str:
    pod = node.pods().get(name)
    return str(pod["status"].get("phase", "")) if pod else ""


def running(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(name)
    if pod and pod["status"].get("phase") == "Running":
        statuses = pod["status"].get("containerStatuses") or []
        if statuses and all("running" in c["state"] for c in statuses):
            return pod
    return None


def evicted(node: KletNode, name: str) -> dict[str, Any] | None:
    pod = node.pods().get(name)
    if pod and pod["status"].get("phase") == "Failed":
        return pod
    return None


def evicted_events(node: KletNode, name: str) -> list[Any]:
    return [e for e in bus_events(node) if e.reason == "Evicted" and e.involved.get("name") == name]


def manager_log(node: KletNode) -> str:
    """The eviction manager's own log lines: what it measured, reclaimed and evicted."""
    lines = [line for line in node.log("eviction").splitlines() if "eviction/manager.py" in line]
    return "\n".join(lines)[-6000:]


def metric(node: KletNode, service: str, line_prefix: str) -> float | None:
    for line in node.metrics(service).splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def check_evicted(node: KletNode, name: str, resource: str) -> dict[str, Any]:
    """Failed, reason Evicted, upstream's message, DisruptionTarget, one Warning Event."""
    try:
        pod: dict[str, Any] = wait_for(
            lambda: evicted(node, name), timeout_s=3 * MONITORING_S + 30, what=f"{name} evicted"
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\neviction manager log:\n{manager_log(node)}") from None
    status = pod["status"]
    assert status["reason"] == "Evicted", status
    message = status["message"]
    assert message.startswith(f"The node was low on resource: {resource}. Threshold quantity: ")
    [target] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"]) == ("True", "TerminationByKubelet")
    assert target["message"] == message
    events = wait_for(lambda: evicted_events(node, name), timeout_s=10, what="Evicted event")
    assert [(e.type, e.message) for e in events] == [("Warning", message)]
    return pod


PRESSURE_MI = 1000  # both memory thresholds; above HOG_MI − HEADROOM_MI (see PodMemory)
HEADROOM_MI = 400  # how much the pods may grow before allocatableMemory.available crosses
HOG_MI = 800  # what the memory-hungry pods hold


def memory_capacity() -> int:
    return parse_meminfo(Path("/proc/meminfo").read_text())


def pods_working_set(cgroup_root: str) -> int:
    """The `<cgroupRoot>/kubepods` cgroup's working set, as the eviction service reads it."""
    cgroups = CgroupFS()
    kubepods = f"{cgroup_root}/kubepods"
    if not cgroups.exists(kubepods):
        return 0
    working_set = cgroups.stats(kubepods).memory_working_set_bytes
    assert working_set is not None
    return working_set


class PodMemory:
    """allocatableMemory.available set up from what the pods use now: allocatable =
    capacity − systemReserved = the pods' working set + the threshold + HEADROOM_MI.

    The node's pods go under a cgroupRoot of the test's own: enforceNodeAllocatable
    [pods] caps its kubepods cgroup at that allocatable, which the host's `/kubepods`
    (shared with every other node) must never get. The cap sits PRESSURE_MI above the
    eviction threshold, so a pod holding HOG_MI is evicted before the kernel's OOM
    killer would act in the kubepods cgroup."""

    def __init__(self) -> None:
        self.cgroup_root = f"/klet-eviction-{uuid.uuid4().hex[:8]}"
        wanted = pods_working_set(self.cgroup_root) + (PRESSURE_MI + HEADROOM_MI) * MI
        self.reserved_mi = (memory_capacity() - wanted) // MI
        self.allocatable = memory_capacity() - self.reserved_mi * MI
        self.threshold = PRESSURE_MI * MI

    def flags(self, transition_period: str) -> list[str]:
        return [
            "--eviction-hard",
            f"memory.available<{PRESSURE_MI}Mi",
            "--system-reserved",
            f"memory={self.reserved_mi}Mi",
            "--eviction-pressure-transition-period",
            transition_period,
            "--cgroup-root",
            self.cgroup_root,
        ]

    def available(self) -> int:
        return self.allocatable - pods_working_set(self.cgroup_root)

    def remove_cgroups(self) -> None:
        """rmdir the test's cgroup root in every hierarchy, deepest first (best effort:
        a cgroup that still holds a process stays)."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if not top.is_dir() or top.is_symlink():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError:
                pass


def hold_memory(mib: int) -> list[str]:
    """busybox tail buffers all of a line-less input and waits for more: it holds `mib`."""
    return ["sh", "-c", f"(head -c {mib}m /dev/zero; sleep 100000) | tail"]


def start(node: KletNode) -> None:
    node.start(*SERVICES)


class Crossing:
    """Samples allocatableMemory.available every 0.2 s in a thread and keeps when it
    first fell below the threshold (the eviction may free the memory before a poll
    would see it)."""

    def __init__(self, memory: PodMemory) -> None:
        self.memory = memory
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.at is None:
            if self.memory.available() < self.memory.threshold:
                self.at = time.time()
            self._stop.wait(0.2)

    def __enter__(self) -> Crossing:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- memory ------------------------------------------------------------------------------


@pytest.fixture
def pod_memory() -> Iterator[PodMemory]:
    memory = PodMemory()
    yield memory
    memory.remove_cgroups()


def test_memory_pressure_evicts_the_pod_over_its_request(
    node_factory: Any, pod_memory: PodMemory
) -> None:
    memory = pod_memory
    node: KletNode = node_factory(extra_flags=memory.flags("20s"))
    start(node)
    calm = api_pod(
        node, "calm", command=["sleep", "100000"], requests={"memory": "128Mi", "cpu": "10m"}
    )
    publish(node, calm)
    wait_for(lambda: running(node, "calm"), timeout_s=60, what="calm Running")
    assert node_conditions(node) == {
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
    }

    hog = api_pod(node, "hog", command=hold_memory(HOG_MI), requests={"memory": "64Mi"})
    with Crossing(memory) as crossing:
        publish(node, hog)
        pod = check_evicted(node, "hog", "memory")
        killed_at = time.time()
    assert crossing.at is not None, "allocatableMemory.available never fell below the threshold"
    crossed = crossing.at
    message = pod["status"]["message"]
    assert f"Threshold quantity: {PRESSURE_MI}Mi, available: " in message
    assert "Container hog was using " in message
    assert message.endswith(", request is 64Mi, has larger consumption of memory. ")
    finished = pod["status"]["containerStatuses"][0]["state"]
    assert "terminated" in finished or "waiting" in finished, finished
    # Two monitoring intervals, plus the kill, from the crossing.
    assert killed_at - crossed < 2 * MONITORING_S + 15, killed_at - crossed
    print(f"\nmemory: threshold crossed -> pod Failed seen after {killed_at - crossed:.1f}s")

    assert running(node, "calm"), node.pods()["calm"]["status"]
    assert node_conditions(node)["MemoryPressure"] == "True"
    # klet why names the signal, its threshold and why this pod was the one.
    hog_ref = f"{hog['metadata']['namespace']}/hog"
    story = wait_for(
        lambda: (s := why_story(node, hog_ref)) is not None and "evicted" in s["answer"] and s,
        timeout_s=30,
        what="klet why hog: evicted",
    )
    answer = story["answer"]
    assert answer.startswith(
        "evicted under memory pressure: signal allocatableMemory.available "
        f"(allocatableMemory.available<{PRESSURE_MI}Mi (hard) met, "
    ), answer
    assert "chosen because " in answer and answer.endswith(message.strip()), answer
    reasons = [e["reason"] for e in story["timeline"]]
    assert reasons.index("EvictionChosen") < reasons.index("Evicted"), reasons
    assert story["timeline"][reasons.index("EvictionChosen")]["source"] == "eviction"
    # The note is for the history only: no Event of it on the way to the apiserver.
    assert not [e for e in bus_events(node) if e.reason == "EvictionChosen" and not e.extra]
    evictions = 'kubelet_evictions{eviction_signal="allocatableMemory.available"}'
    assert metric(node, "eviction", evictions) == 1.0
    assert metric(node, "eviction", 'kubelet_evictions{eviction_signal="memory.available"}') is None
    # A busy machine: memory used outside the pods (here by this test process, more
    # than the pods' headroom) does not keep the node under pressure.
    ballast = b"\x01" * ((HEADROOM_MI + 200) * MI)
    wait_for(
        lambda: node_conditions(node)["MemoryPressure"] == "False",
        timeout_s=20 + 2 * MONITORING_S + 20,
        what="MemoryPressure cleared after the transition period",
    )
    del ballast
    assert running(node, "calm")
    assert len(evicted_events(node, "hog")) == 1


def test_persistent_memory_pressure_restart_and_admission(
    node_factory: Any, pod_memory: PodMemory
) -> None:
    node: KletNode = node_factory(extra_flags=pod_memory.flags("5m"))
    start(node)
    # The memory is held by a system-critical pod: it is never evicted, so the pressure
    # outlasts the eviction of the only other pod.
    critical = api_pod(node, "critical", command=hold_memory(HOG_MI), priority=2_000_001_000)
    victim = api_pod(node, "victim", command=["sleep", "100000"])
    publish(node, critical, victim)
    pod = check_evicted(node, "victim", "memory")
    assert running(node, "critical")
    assert node_conditions(node)["MemoryPressure"] == "True"
    # The next pass finds only the critical pod (unless one before the victim ran did).
    wait_for(
        lambda: "cannot evict a critical pod" in node.log("eviction"),
        timeout_s=2 * MONITORING_S + 10,
        what="the critical pod spared",
    )

    # A restart of the eviction service during the pressure evicts nothing again.
    node.kill("eviction")
    node.start("eviction")
    wait_for(
        lambda: metric(
            node, "eviction", 'klet_eviction_signal_available{eviction_signal="memory.available"}'
        ),
        timeout_s=30,
        what="a pass of the restarted eviction service",
    )
    # Its first pass (under way) and one whole pass after it evict nothing again.
    node.wait_passes("eviction", EVICTION_PASSES, 2, timeout_s=2 * MONITORING_S + 15)
    assert len(evicted_events(node, "victim")) == 1
    assert node.pods()["victim"]["status"]["message"] == pod["status"]["message"]
    assert running(node, "critical")
    assert metric(node, "eviction", "kubelet_evictions{") is None
    assert node_conditions(node)["MemoryPressure"] == "True"

    # Admission under MemoryPressure: BestEffort rejected, Burstable admitted.
    besteffort = api_pod(node, "late-besteffort", command=["sleep", "100000"])
    burstable = api_pod(
        node, "late-burstable", command=["sleep", "100000"], requests={"memory": "16Mi"}
    )
    publish(node, besteffort, burstable)
    rejected: dict[str, Any] = wait_for(
        lambda: evicted(node, "late-besteffort"), timeout_s=30, what="late-besteffort rejected"
    )
    status = rejected["status"]
    assert (status["reason"], status["message"]) == (
        "Evicted",
        "Pod was rejected: The node had condition: [MemoryPressure]. ",
    )
    assert not [c for c in status.get("conditions", []) if c["type"] == "DisruptionTarget"]
    wait_for(lambda: running(node, "late-burstable"), timeout_s=60, what="late-burstable Running")


# -- disk ----------------------------------------------------------------------------------


def mount_tmpfs(path: Path, size_mib: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], check=True
    )


def test_disk_pressure_evicts_the_pod_filling_its_emptydir(node_factory: Any) -> None:
    node: KletNode = node_factory(
        extra_flags=[
            "--eviction-hard",
            "nodefs.available<24Mi",
            "--eviction-pressure-transition-period",
            "20s",
        ]
    )
    mount_tmpfs(node.root_dir, 64)
    try:
        start(node)
        calm = api_pod(node, "calm", command=["sleep", "100000"])
        publish(node, calm)
        wait_for(lambda: running(node, "calm"), timeout_s=60, what="calm Running")
        writer = api_pod(
            node,
            "writer",
            command=["sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=48; sleep 100000"],
            volumes=[{"name": "data", "emptyDir": {}}],
            mounts=[{"name": "data", "mountPath": "/data"}],
        )
        publish(node, writer)
        pod = check_evicted(node, "writer", "ephemeral-storage")
        assert "Threshold quantity: 24Mi, available: " in pod["status"]["message"]
        assert running(node, "calm")
        assert node_conditions(node)["DiskPressure"] == "True"

        # Under DiskPressure every new (non-critical) pod is rejected.
        late = api_pod(node, "late", command=["sleep", "100000"], requests={"memory": "16Mi"})
        publish(node, late)
        rejected: dict[str, Any] = wait_for(
            lambda: evicted(node, "late"), timeout_s=30, what="late rejected"
        )
        assert rejected["status"]["message"] == (
            "Pod was rejected: The node had condition: [DiskPressure]. "
        )
        # The evicted pod's emptyDir is gone, so the pressure ends.
        wait_for(
            lambda: node_conditions(node)["DiskPressure"] == "False",
            timeout_s=20 + 2 * MONITORING_S + 20,
            what="DiskPressure cleared",
        )
        assert running(node, "calm")
        assert (
            metric(node, "eviction", 'kubelet_evictions{eviction_signal="nodefs.available"}') == 1.0
        )
    finally:
        node.stop()
        node.release_mounts()


def test_disk_eviction_goes_on_when_image_gc_is_down(node_factory: Any, tmp_path: Path) -> None:
    """The root dir shares the images' filesystem, so nodefs pressure asks image-gc's
    FreeSpace first; image-gc is not running, so that call fails and the pod is still
    evicted. The threshold sits just under what the filesystem has free now."""
    stat = json.loads(
        subprocess.run(
            ["stat", "-f", "-c", '{"bavail": %a, "bsize": %S}', str(tmp_path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    free = stat["bavail"] * stat["bsize"]
    threshold = (free - 200 * MI) // MI
    node: KletNode = node_factory(
        extra_flags=["--eviction-hard", f"nodefs.available<{threshold}Mi"]
    )
    start(node)
    writer = api_pod(
        node,
        "writer",
        command=["sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=400; sleep 100000"],
        volumes=[{"name": "data", "emptyDir": {}}],
        mounts=[{"name": "data", "mountPath": "/data"}],
    )
    publish(node, writer)
    check_evicted(node, "writer", "ephemeral-storage")
    assert metric(node, "eviction", 'klet_eviction_node_reclaims_total{outcome="error"}') or metric(
        node, "eviction", 'klet_eviction_node_reclaims_total{outcome="timeout"}'
    )


# -- PIDs ------------------------------------------------------------------------------------


def pid_available() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    return pid_max - tasks


def test_pid_pressure_evicts_the_forking_pod(node_factory: Any) -> None:
    # pid.available is the whole machine's: the margin is wide (the pod forks 2,000,
    # the threshold is 1,000 below today's) so other processes coming and going do not
    # cross it before the forker does, or after it was evicted.
    threshold = pid_available() - 1000
    node: KletNode = node_factory(
        extra_flags=[
            "--eviction-hard",
            f"pid.available<{threshold}",
            "--eviction-pressure-transition-period",
            "20s",
        ]
    )
    start(node)
    calm = api_pod(node, "calm", command=["sleep", "100000"])
    publish(node, calm)
    wait_for(lambda: running(node, "calm"), timeout_s=60, what="calm Running")
    forker = api_pod(
        node,
        "forker",
        command=["sh", "-c", "for i in $(seq 2000); do sleep 100000 & done; wait"],
    )
    publish(node, forker)
    pod = check_evicted(node, "forker", "pids")
    assert f"Threshold quantity: {format_count(threshold)}, available: " in pod["status"]["message"]
    assert running(node, "calm")
    assert node_conditions(node)["PIDPressure"] == "True"
    assert metric(node, "eviction", 'kubelet_evictions{eviction_signal="pid.available"}') == 1.0


# -- node-level reclaim with image-gc running -----------------------------------------------

UNUSED = tuple(f"{TEST_REGISTRY_HOST}/evict-unused{i}:1" for i in range(3))


@pytest.fixture(scope="module")
def small_imagefs() -> Iterator[DevStack]:
    """A DevStack whose containerd root (the image filesystem) is a 160 MiB tmpfs, with
    three images of ~6 MiB each that no pod uses."""
    dir = Path(tempfile.mkdtemp(prefix="klet-ev-", dir="/tmp"))
    stack = DevStack(dir, containerd_root_size=160 * MI)
    stack.start()
    try:
        for ref in UNUSED:
            stack.add_image(
                ImageSpec(name=ref.rpartition(":")[0], tag="1", cmd=["sh"], padding_bytes=4 * MI)
            )
        yield stack
    finally:
        stack.stop()
        if not os.environ.get("KLET_KEEP_DEVSTACK"):
            shutil.rmtree(dir, ignore_errors=True)


def cri_images(stack: DevStack, *, pull: tuple[str, ...] = ()) -> set[str]:
    async def go() -> set[str]:
        cri = RuntimeClient(CRISettings(runtime_endpoint=stack.runtime_endpoint, timeout_s=60))
        try:
            for ref in pull:
                await cri.pull_image(ref)
            return {t for i in await cri.list_images() for t in i.repo_tags}
        finally:
            await cri.close()

    return asyncio.run(go())


def imagefs_available(stack: DevStack) -> int:
    assert stack.containerd is not None
    st = os.statvfs(stack.containerd.root)
    return st.f_bavail * st.f_frsize


def test_disk_pressure_is_answered_by_freeing_images_first(
    small_imagefs: DevStack, tmp_path: Path
) -> None:
    stack = small_imagefs
    assert set(UNUSED) <= cri_images(stack, pull=UNUSED)
    node = KletNode(
        stack,
        tmp_path / "n",
        node_name="evictgc",
        extra_flags=[
            "--image-gc-high-threshold",
            "100",  # no periodic image GC: only FreeSpace removes images here
            "--minimum-image-ttl-duration",
            "1s",
            # One monitoring period: the pass after the reclaiming one (which evicts
            # nobody, so it does not measure again at once) comes a whole period later,
            # so DiskPressure still holds when the test sees the image removed, and each
            # wait for it to clear is 10 s shorter than with 20 s.
            "--eviction-pressure-transition-period",
            "10s",
        ],
    )
    try:
        node.start("syncloop", "status-reporter", "image-gc")
        calm = api_pod(node, "calm", command=["sleep", "100000"])
        publish(node, calm)
        wait_for(lambda: running(node, "calm"), timeout_s=60, what="calm Running")
        time.sleep(2)  # the unused images are older than --minimum-image-ttl-duration
        # Just above what is free: met at once, and freeing the unused images clears it.
        threshold = (imagefs_available(stack) + 6 * MI) // MI
        # Only the eviction service needs it, and only now: before its --service-port.
        node.procs["eviction"].argv[-2:-2] = ["--eviction-hard", f"imagefs.available<{threshold}Mi"]
        node.start("eviction")
        try:
            # FreeSpace is asked for the deficit only: one ~6 MiB image is enough.
            wait_for(
                lambda: len(set(UNUSED) & cri_images(stack)) == len(UNUSED) - 1,
                timeout_s=3 * MONITORING_S,
                what="an unused image removed through FreeSpace",
            )
        except AssertionError as err:
            logs = {s: node.log(s)[-4000:] for s in ("eviction", "image-gc")}
            raise AssertionError(f"{err}\n{logs['eviction']}\n{logs['image-gc']}") from None
        assert node_conditions(node)["DiskPressure"] == "True"
        # The reclaiming pass ends, and a whole pass after it finds the pressure gone:
        # nobody is evicted.
        node.wait_passes("eviction", EVICTION_PASSES, 2, timeout_s=2 * MONITORING_S + 15)
        assert running(node, "calm")
        assert metric(node, "eviction", "kubelet_evictions{") is None
        assert metric(node, "eviction", 'klet_eviction_node_reclaims_total{outcome="ok"}') == 1.0
        assert len(set(UNUSED) & cri_images(stack)) == len(UNUSED) - 1

        # Once the condition clears (a new pod would be rejected under it), a pod fills
        # its writable layer on the image filesystem: FreeSpace frees what unused images
        # are left, that is not enough, so the pod is evicted.
        wait_for(
            lambda: node_conditions(node)["DiskPressure"] == "False",
            timeout_s=20 + 2 * MONITORING_S + 20,
            what="DiskPressure cleared after the reclaim",
        )
        writer = api_pod(
            node,
            "writer",
            command=["sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=60; sleep 100000"],
        )
        publish(node, writer)
        pod = check_evicted(node, "writer", "ephemeral-storage")
        assert f"Threshold quantity: {threshold}Mi, available: " in pod["status"]["message"]
        assert running(node, "calm"), manager_log(node)
        assert not set(UNUSED) & cri_images(stack)  # FreeSpace took the rest first
        assert (
            metric(node, "eviction", 'kubelet_evictions{eviction_signal="imagefs.available"}')
            == 1.0
        )
        # The evicted pod's dead container is the next thing FreeSpace removes, which
        # ends the pressure (once containerd has given its layer back, which a busy host
        # delays: the manager waits for it): the calm pod is never evicted.
        wait_for(
            lambda: node_conditions(node)["DiskPressure"] == "False",
            timeout_s=20 + 3 * MONITORING_S + 20,
            what="DiskPressure cleared",
        )
        assert running(node, "calm"), manager_log(node)
        assert (
            metric(node, "eviction", 'kubelet_evictions{eviction_signal="imagefs.available"}')
            == 1.0
        )
    finally:
        node.stop()
        asyncio.run(remove_node_pods(stack.runtime_endpoint, node.node_name))
        node.release_mounts()

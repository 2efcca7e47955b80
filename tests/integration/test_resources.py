"""Pod resources on real containerd: the pod cgroup and each container's cgroup carry
upstream's CPU shares, CFS quota and memory limit (and the memory+swap limit of NoSwap
where the kernel accounts swap; the container is created with a hugetlb limit of 0 for
each page size although this host does not mount hugetlb), `/pods` reports the QoS class, the
container's processes get the expected oom_score_adj (clamped to what this host allows),
and the pod cgroup goes away with the pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from klet.cgroups.fs import swap_control
from klet.cgroups.machine import mem_total_bytes
from klet.syncloop.containers import podcgroups
from klet.syncloop.model import resources

from tests.harness.node import KletNode, container_status
from tests.harness.pods import running
from tests.harness.waiting import wait_for

CG = Path("/sys/fs/cgroup")

BURSTABLE = """
apiVersion: v1
kind: Pod
metadata:
  name: burst
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        requests: {cpu: 250m, memory: 64Mi}
        limits: {cpu: 500m, memory: 128Mi}
"""

GUARANTEED = """
apiVersion: v1
kind: Pod
metadata:
  name: guar
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        limits: {cpu: 500m, memory: 128Mi}
"""


def read(path: Path) -> str:
    return path.read_text().strip()


def check_pod(node: KletNode, manifests: Path, name: str, text: str, qos: str) -> None:
    (manifests / f"{name}.yaml").write_text(text)
    pod: dict[str, Any] = wait_for(
        lambda: running(node, name), timeout_s=20, what=f"{name} Running"
    )
    assert pod["status"]["qosClass"] == qos
    uid = pod["metadata"]["uid"]
    parent = f"kubepods/pod{uid}" if qos == "Guaranteed" else f"kubepods/{qos.lower()}/pod{uid}"
    cid = container_status(pod, "main")["containerID"].split("://", 1)[1]
    for d in (CG / "cpu" / parent, CG / "cpu" / parent / cid):
        assert read(d / "cpu.shares") == ("512" if qos == "Guaranteed" else "256"), d
        assert read(d / "cpu.cfs_period_us") == "100000", d
        assert read(d / "cpu.cfs_quota_us") == "50000", d
    for d in (CG / "memory" / parent, CG / "memory" / parent / cid):
        assert read(d / "memory.limit_in_bytes") == "134217728", d
    # memorySwap NoSwap, where the kernel accounts swap (this host): the container's
    # memory+swap limit is its memory limit, so it cannot use swap beyond it.
    if swap_control() == "memsw":
        assert read(CG / "memory" / parent / cid / "memory.memsw.limit_in_bytes") == "134217728"
    assert (CG / "pids" / parent).is_dir()
    pids = read(CG / "cpu" / parent / cid / "cgroup.procs").split()
    assert pids
    capacity = mem_total_bytes()
    container = {"name": "main", "resources": {"requests": {"memory": "64Mi"}}}
    spec = {
        "spec": {
            "containers": [
                container
                if qos == "Burstable"
                else {"name": "main", "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}}
            ]
        }
    }
    raw = resources.oom_score_adj(spec, spec["spec"]["containers"][0], capacity)
    expected = resources.clamp_oom_score_adj(raw, podcgroups.oom_score_adj_floor())
    if qos == "Burstable":
        assert raw == 1000 - (1000 * 64 * 1024**2) // capacity
    else:
        assert raw == -997
    assert int(read(Path(f"/proc/{pids[0]}/oom_score_adj"))) == expected
    (manifests / f"{name}.yaml").unlink()
    wait_for(
        lambda: not any((CG / c / parent).exists() for c in ("cpu", "memory", "pids")),
        timeout_s=20,
        what=f"{name}'s pod cgroup removed",
    )


def test_burstable_pod_limits(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    check_pod(node, manifests, "burst", BURSTABLE, "Burstable")


def test_guaranteed_pod_limits(node_factory: Any, manifests: Path) -> None:
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    check_pod(node, manifests, "guar", GUARANTEED, "Guaranteed")


# The test image has no `[` or `seq`: the loop runs over 60 literal words. busybox sh
# exits when a fork fails, so the container logs "can't fork" and never "forked".
FORKER = """
apiVersion: v1
kind: Pod
metadata:
  name: forker
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command:
        - sh
        - -c
        - for i in WORDS; do sleep 100000 & done; echo forked; sleep 100000
""".replace("WORDS", " ".join(str(i) for i in range(60)))

PIDS_LIMIT = 20


def test_pod_pids_limit_caps_a_forking_pod(node_factory: Any, manifests: Path) -> None:
    """--pod-max-pids reaches the pod cgroup's pids.max, and a pod that forks 60
    processes is stopped at the limit: its shell's fork fails ("can't fork")."""
    node: KletNode = node_factory(
        manifest_dir=manifests, extra_flags=["--pod-max-pids", str(PIDS_LIMIT)]
    )
    node.start()
    (manifests / "forker.yaml").write_text(FORKER)

    def log_text() -> str:
        return "".join(f.read_text() for f in node.logs_dir.glob("*_forker-*/main/*.log"))

    text = wait_for(
        lambda: ("forked" in log_text() or "can't fork" in log_text()) and log_text(),
        timeout_s=30,
        what="the forker's shell to finish forking",
    )
    assert "can't fork" in text and "forked" not in text, text
    uid = next(iter(node.logs_dir.glob("*_forker-*"))).name.rsplit("_", 1)[1]
    pids_max = CG / "pids" / "kubepods" / "besteffort" / f"pod{uid}" / "pids.max"
    assert read(pids_max) == str(PIDS_LIMIT)


# Kubernetes 1.34's pod totals (issue 37): a native sidecar counts in the pod cgroup, and
# pod-level resources (spec.resources) make the QoS class and the pod cgroup.
SIDECAR = """
apiVersion: v1
kind: Pod
metadata:
  name: mesh
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
    - name: proxy
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      restartPolicy: Always
      resources:
        limits: {cpu: 500m, memory: 100Mi}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        limits: {cpu: "1", memory: 200Mi}
"""

POD_LEVEL = """
apiVersion: v1
kind: Pod
metadata:
  name: podlevel
spec:
  terminationGracePeriodSeconds: 1
  resources:
    requests: {cpu: 750m, memory: 96Mi}
    limits: {cpu: 750m, memory: 96Mi}
  containers:
    - name: main
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
    - name: helper
      image: registry.klet.test/busybox:1.36
      command: ["sleep", "100000"]
      resources:
        limits: {cpu: 250m, memory: 32Mi}
"""


def _cgroup_limits(d: Path) -> tuple[str, str, str]:
    return (
        read(CG / "cpu" / d / "cpu.shares"),
        read(CG / "cpu" / d / "cpu.cfs_quota_us"),
        read(CG / "memory" / d / "memory.limit_in_bytes"),
    )


def _container_dir(pod: dict[str, Any], parent: str, name: str) -> Path:
    return Path(parent) / container_status(pod, name)["containerID"].split("://", 1)[1]


def test_a_native_sidecar_counts_in_the_pod_cgroup(node_factory: Any, manifests: Path) -> None:
    """An app of 1 CPU / 200Mi beside a sidecar of 500m / 100Mi: the pod cgroup holds
    1.5 CPU / 300Mi (it held the app's alone, so the sidecar ate into the app's limit)."""
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "mesh.yaml").write_text(SIDECAR)
    pod: dict[str, Any] = wait_for(lambda: running(node, "mesh"), timeout_s=30, what="mesh Running")
    assert pod["status"]["qosClass"] == "Guaranteed"
    parent = f"kubepods/pod{pod['metadata']['uid']}"
    assert _cgroup_limits(Path(parent)) == ("1536", "150000", str(300 * 1024**2))
    assert _cgroup_limits(_container_dir(pod, parent, "main")) == (
        "1024",
        "100000",
        str(200 * 1024**2),
    )


def test_pod_level_resources_make_the_qos_class_and_the_pod_cgroup(
    node_factory: Any, manifests: Path
) -> None:
    """spec.resources 750m / 96Mi: Guaranteed (it was Burstable and unlimited), a
    pod cgroup of 750m / 96Mi, the container without limits held to the pod's in its own
    cgroup, the one with its own limits to those."""
    node: KletNode = node_factory(manifest_dir=manifests)
    node.start()
    (manifests / "podlevel.yaml").write_text(POD_LEVEL)
    pod: dict[str, Any] = wait_for(
        lambda: running(node, "podlevel"), timeout_s=30, what="podlevel Running"
    )
    assert pod["status"]["qosClass"] == "Guaranteed"
    parent = f"kubepods/pod{pod['metadata']['uid']}"
    assert _cgroup_limits(Path(parent)) == ("768", "75000", str(96 * 1024**2))
    main = _cgroup_limits(_container_dir(pod, parent, "main"))
    assert main[1:] == ("75000", str(96 * 1024**2))
    helper = _cgroup_limits(_container_dir(pod, parent, "helper"))
    assert helper[1:] == ("25000", str(32 * 1024**2))

"""`cgroupDriver: systemd` on a node whose PID 1 is a real systemd (tests/harness/systemd_node.py):
klet up in the node container as a systemd service, its containerd's runc with
`SystemdCgroup = true`, three static pods, one of each QoS class.

Checked: each pod runs; the node's slices (`kubepods.slice`, `kubepods-burstable.slice`,
`kubepods-besteffort.slice`) and each pod's slice exist with upstream's names
(`kubepods-pod<uid_>.slice` for Guaranteed, `kubepods-<qos>-pod<uid_>.slice` otherwise),
`Wants=` their parent, and carry the pod's limits both as systemd properties and in the
host's cgroup files (CPU shares, CFS quota, memory limit); every container of the pod
(sandbox included) runs in a `cri-containerd-<id>.scope` inside its pod's slice. A pod
whose manifest goes is stopped and its slice with it (unit and cgroup directories),
while the other pods carry on; klet.stats' host reader, run in the node, finds each pod's
slice and kubepods.slice (what /stats/summary and eviction read); once every pod is gone
only the node's three slices are left. Then klet.service is stopped and the node powered
off (`docker stop`, SIGRTMIN+3).

The node joins a control plane with controllers of this module's own (the harness's
relays: the apiserver in, the kubelet API and klet up's registry out), and upstream's
e2e suite runs the pod-lifecycle specs of the conformance smoke subset (LIFECYCLE)
against it, with the suite's images pushed to klet up's registry in the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from klet.cgroups.machine import mem_total_bytes
from klet.devstack import TEST_REGISTRY_HOST, free_port
from klet.testbed.cluster import ControlPlane

from tests.harness.cluster_fixtures import _plane
from tests.harness.suite_smoke import (
    LIFECYCLE,
    check_all_passed,
    focus_of,
    require_binaries,
)
from tests.harness.systemd_node import SystemdNode, build_image
from tests.harness.waiting import wait_for
from tools.e2e.conformance import SKIP, SuiteRun, build_all, node_state, suite_argv
from tools.e2e.images import build_binaries, build_images, push_images
from tools.e2e.report import parse_report
from tools.e2e.suite import repo_list_yaml

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(900)]

# system.slice holds klet.service itself (systemd-run's units go there), so its
# reservation is generous: a CPU, 8 GiB and 100000 tasks.
CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
enforceNodeAllocatable: [pods, system-reserved]
systemReservedCgroup: /system.slice
systemReserved: {cpu: "1", memory: 8Gi, pid: "100000"}
"""
RESERVED_MEMORY = 8 << 30
BUSYBOX = "registry.klet.test/busybox:1.36"
# klet.stats' host reader, run in the node: kubepods' memory usage and each pod's cgroup.
READ_CGROUPS = """\
import json, sys
from pathlib import Path
from klet.cgroups import CgroupFS
from klet.stats.host import HostReader
r = HostReader(cgroups=CgroupFS(), root_dir=Path("/"), pod_logs_dir=Path("/"), cgroup_root="/")
k = r.kubepods()
print(json.dumps({
    "kubepods": k is not None and bool(k.memory_usage_bytes),
    "pods": {uid: r.pod_cgroup(uid) for uid in sys.argv[1:]},
}))
"""

PODS = {
    # name: (resources, qos class, cpu.shares, cfs quota (us, -1 none), memory limit (None: none))
    "guaranteed": (
        "{requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: 100m, memory: 64Mi}}",
        "Guaranteed",
        102,
        10_000,
        64 << 20,
    ),
    "burstable": (
        "{requests: {cpu: 50m, memory: 32Mi}, limits: {cpu: 250m, memory: 128Mi}}",
        "Burstable",
        51,
        25_000,
        128 << 20,
    ),
    "besteffort": ("{}", "BestEffort", 2, -1, None),
}


def manifest(name: str, resources: str) -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: {BUSYBOX}
      command: ["sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]
      resources: {resources}
"""


@pytest.fixture(scope="module")
def plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """A control plane with controllers and scheduler of this module's own: upstream's
    suite wants every node of its cluster Ready, and no other test's node in it."""
    yield from _plane(pytestconfig, prefix="klet-cpsd-", controllers=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, plane: ControlPlane) -> Iterator[SystemdNode]:
    """The systemd node, klet up in it joined to `plane`; its kubelet API is relayed out
    on the same port, which the Node reports, for the apiserver's logs and exec."""
    base = tmp_path_factory.mktemp("sd")
    began = time.monotonic()
    archive = build_image(base / "image")
    built = time.monotonic() - began
    node = SystemdNode(base / "n")
    try:
        node.start(archive)
        port = free_port()
        node.start_klet(CONFIG, *node.join(plane), "--port", str(port))
        node.relay_out("kubelet", port, port)
        wait_for(
            lambda: node_state(plane, node.name)[0],
            timeout_s=180,
            what=f"node {node.name} ready for the suite (klet journal at the end)",
        )
        print(
            f"systemd node: image {built:.0f}s, dockerd+load {node.timings['load']:.0f}s, "
            f"boot {node.timings['boot']:.0f}s, Ready {time.monotonic() - began:.0f}s"
        )
        yield node
    finally:
        node.stop()


def running(node: SystemdNode, names: set[str]) -> dict[str, dict[str, Any]] | None:
    by_name = {p["metadata"]["name"].rsplit("-", 1)[0]: p for p in node.pods()}
    if names <= by_name.keys() and all(
        by_name[n].get("status", {}).get("phase") == "Running" for n in names
    ):
        return {n: by_name[n] for n in names}
    return None


def pod_unit(uid: str, qos: str) -> str:
    uid_ = uid.replace("-", "_")
    if qos == "Guaranteed":
        return f"kubepods-pod{uid_}.slice"
    return f"kubepods-{qos.lower()}-pod{uid_}.slice"


def read(path: Path) -> str:
    return path.read_text().strip()


def test_pods_of_each_qos_class_in_their_slices(node: SystemdNode, plane: ControlPlane) -> None:
    began = time.monotonic()
    for name, (resources, *_rest) in PODS.items():
        (node.manifests / f"{name}.yaml").write_text(manifest(name, resources))
    pods = wait_for(
        lambda: running(node, set(PODS)),
        timeout_s=180,
        what=f"pods {sorted(PODS)} Running (klet journal at the end of the failure)",
    )
    print(f"3 pods running after {time.monotonic() - began:.0f}s")

    for unit in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"):
        props = node.unit_properties(unit, "ActiveState", "Transient")
        assert props == {"ActiveState": "active", "Transient": "yes"}, (unit, props)
    # enforceNodeAllocatable: kubepods.slice holds capacity − systemReserved, and the
    # existing system.slice gets systemReserved (SetUnitProperties), with the Event.
    capacity = mem_total_bytes()
    assert node.unit_properties("kubepods.slice", "MemoryLimit") == {
        "MemoryLimit": str(capacity - RESERVED_MEMORY)
    }
    assert node.unit_properties("system.slice", "CPUShares", "MemoryLimit", "TasksMax") == {
        "CPUShares": "1024",
        "MemoryLimit": str(RESERVED_MEMORY),
        "TasksMax": "100000",
    }
    wait_for(
        lambda: (
            "Updated limits on system reserved cgroup /system.slice"
            in plane.kubectl(
                "get",
                "events",
                "--all-namespaces",
                "--field-selector=reason=NodeAllocatableEnforced",
                "-o",
                "jsonpath={.items[*].message}",
            ).stdout
        ),
        timeout_s=30,
        what="the NodeAllocatableEnforced Event in the apiserver",
    )

    for name, (_res, qos, shares, quota, memory) in PODS.items():
        pod = pods[name]
        uid = pod["metadata"]["uid"]
        assert pod["status"]["qosClass"] == qos
        unit = pod_unit(uid, qos)
        props = node.unit_properties(
            unit, "ActiveState", "Wants", "ControlGroup", "CPUShares", "MemoryLimit"
        )
        parent = "kubepods.slice" if qos == "Guaranteed" else f"kubepods-{qos.lower()}.slice"
        assert props["ActiveState"] == "active", (unit, props)
        assert props["Wants"] == parent, (unit, props)
        in_qos = "" if qos == "Guaranteed" else f"{parent}/"
        assert props["ControlGroup"].endswith(f"/kubepods.slice/{in_qos}{unit}"), props
        assert props["CPUShares"] == str(shares)
        assert props["MemoryLimit"] == (str(memory) if memory else "infinity")
        cgroup = props["ControlGroup"]
        assert read(node.host_cgroup("cpu", cgroup) / "cpu.shares") == str(shares)
        assert read(node.host_cgroup("cpu", cgroup) / "cpu.cfs_quota_us") == str(quota)
        limit = int(read(node.host_cgroup("memory", cgroup) / "memory.limit_in_bytes"))
        assert limit == memory if memory else limit > 1 << 60
        # Every container of the pod, the sandbox too, in a scope inside the pod's slice.
        scopes = {
            d.name
            for d in node.host_cgroup("memory", cgroup).iterdir()
            if d.is_dir() and d.name.startswith("cri-containerd-")
        }
        main_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        assert f"cri-containerd-{main_id}.scope" in scopes, (name, scopes)
        assert len(scopes) == 2, (name, scopes)  # the sandbox's pause and main
        # Huge pages: the node's systemd mounts hugetlb (the host does not); neither the
        # container nor the pod (its slice's path in the hugetlb hierarchy, which klet
        # writes: systemd has no hugetlb property) may use a size it did not ask for.
        found = node.exec(
            ["find", "/sys/fs/cgroup/hugetlb", "-name", f"cri-containerd-{main_id}.scope"]
        ).stdout.split()
        assert len(found) == 1, (name, found)
        scope_dir = found[0]
        pod_dir = scope_dir.rsplit("/", 1)[0]
        assert pod_dir.endswith("/" + unit), (name, pod_dir)
        for d in (scope_dir, pod_dir):
            for size in ("2MB", "1GB"):
                limit = node.exec(["cat", f"{d}/hugetlb.{size}.limit_in_bytes"]).stdout
                assert limit.strip() == "0", (name, d, size, limit)

    # The stats readers (/stats/summary, eviction) find the pod slices and kubepods.slice
    # in the node's real cgroup tree.
    uids = [pods[n]["metadata"]["uid"] for n in PODS]
    found = json.loads(node.exec(["python3", "-c", READ_CGROUPS, *uids]).stdout)
    assert found["kubepods"], found
    for name in PODS:
        uid = pods[name]["metadata"]["uid"]
        unit = pod_unit(uid, PODS[name][1])
        assert found["pods"][uid] == node.unit_properties(unit, "ControlGroup")["ControlGroup"]

    # A pod whose manifest goes: stopped, and its slice with it; the others carry on.
    gone = pods["burstable"]
    unit = pod_unit(gone["metadata"]["uid"], "Burstable")
    cgroup_dir = node.host_cgroup(
        "memory", node.unit_properties(unit, "ControlGroup")["ControlGroup"]
    )
    (node.manifests / "burstable.yaml").unlink()
    wait_for(
        lambda: unit not in node.units("kubepods-burstable-*.slice") and not cgroup_dir.exists(),
        timeout_s=60,
        what=f"{unit} and {cgroup_dir} gone",
    )
    wait_for(
        lambda: not node.exec(["find", "/sys/fs/cgroup/hugetlb", "-name", unit]).stdout.split(),
        timeout_s=10,
        what=f"{unit}'s hugetlb cgroup gone",
    )
    assert not any(p["metadata"]["uid"] == gone["metadata"]["uid"] for p in node.pods())
    still = running(node, {"guaranteed", "besteffort"})
    assert still is not None
    for name in ("guaranteed", "besteffort"):
        assert still[name]["metadata"]["uid"] == pods[name]["metadata"]["uid"]
        assert still[name]["status"]["containerStatuses"][0]["restartCount"] == 0

    # Every pod removed: every pod slice goes (the suite's pods may come and go beside
    # them); the node's slices stay.
    slices = {pod_unit(pods[n]["metadata"]["uid"], PODS[n][1]) for n in PODS}
    for name in ("guaranteed", "besteffort"):
        (node.manifests / f"{name}.yaml").unlink()
    wait_for(
        lambda: (
            not slices & set(node.units("kubepods-*pod*.slice"))
            and not set(PODS) & {p["metadata"]["name"].rsplit("-", 1)[0] for p in node.pods()}
        ),
        timeout_s=60,
        what="every pod and pod slice gone",
    )
    assert {
        "kubepods.slice",
        "kubepods-burstable.slice",
        "kubepods-besteffort.slice",
    } <= set(node.units("kubepods*.slice"))
    print(f"whole test {time.monotonic() - began:.0f}s")


def test_the_lifecycle_smoke_subset_passes_on_the_systemd_node(
    node: SystemdNode, plane: ControlPlane, tmp_path: Path
) -> None:
    """Upstream's e2e suite against the systemd-driver node: its images pushed to klet
    up's registry in the node (relayed out), the specs of LIFECYCLE run by 2 ginkgo
    processes, each must pass."""
    require_binaries()
    began = time.monotonic()
    bins = build_all()
    cache = Path(os.environ.get("KLET_CACHE", "/var/cache/klet"))
    src = build_binaries(cache=cache)
    endpoints = json.loads((node.state / "run" / "endpoints.json").read_text())
    registry_port = int(str(endpoints["registry"]).rsplit(":", 1)[1])
    host_port = free_port()
    node.relay_out("registry", registry_port, host_port)
    push_images(build_images(src, cache=cache), f"127.0.0.1:{host_port}")
    repo_list = tmp_path / "repo-list.yaml"
    repo_list.write_text(repo_list_yaml(src.manifest(), TEST_REGISTRY_HOST))
    out = tmp_path / "run"
    out.mkdir()
    run = SuiteRun(focus=focus_of(LIFECYCLE), skip=SKIP, procs=2, timeout="8m", verbose=False)
    pushed = time.monotonic() - began
    with (out / "e2e.log").open("wb") as sink:
        subprocess.run(
            suite_argv(bins, run, kubeconfig=plane.admin_kubeconfig, out=out),
            env={**os.environ, "KUBE_TEST_REPO_LIST": str(repo_list)},
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            timeout=600,
            check=False,
        )
    report = out / "report.json"
    assert report.exists(), (out / "e2e.log").read_text()[-4000:]
    check_all_passed(parse_report(json.loads(report.read_text())), LIFECYCLE, out)
    took = time.monotonic() - began
    print(f"lifecycle subset on the systemd node: images {pushed:.0f}s, all {took:.0f}s")

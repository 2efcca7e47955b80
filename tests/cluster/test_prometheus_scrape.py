"""A real Prometheus, configured as kube-prometheus's kubelet ServiceMonitor has
prometheus-operator scrape every kubelet, scrapes a klet node, and every series that
kubernetes-mixin's kubelet dashboard, compute-resources dashboards (pod, namespace,
node) and kubelet alerts read from the kubelet is there for that node.

The node joins the real control plane and runs, from the apiserver, a busy pod (a CPU
loop under a CPU and memory limit, after some direct disk I/O to an emptyDir, with a
readiness probe) and a pod whose image does not exist (the runtime's failed pulls are
what the dashboard's error panel counts). Prometheus (Debian's package; see
tests/harness/prometheus.py for the configuration) reaches 10250 over HTTPS with a
ServiceAccount token bound to the ClusterRole kube-prometheus gives its Prometheus (get
nodes/metrics, GET /metrics), which klet checks with the apiserver's TokenReview and
SubjectAccessReview, every 2 s on `/metrics`, `/metrics/cadvisor` and `/metrics/probes`.

The series lists below come from reading kubernetes-mixin (github
kubernetes-monitoring/kubernetes-mixin, main of 2026-08): dashboards/kubelet.libsonnet,
dashboards/resources/queries/{pod,namespace,node}.libsonnet with the recording rules they
read (rules/apps.libsonnet, rules/kubelet.libsonnet) and alerts/kubelet.libsonnet, with
kube-prometheus's selectors (`job="kubelet", metrics_path="/metrics"` for the kubelet,
`metrics_path="/metrics/cadvisor"` for cAdvisor). Series of kube-state-metrics (kube_pod_info,
kube_pod_container_resource_*, kube_node_status_*, kube_resourcequota, kube_node_spec_*)
and node-exporter are out of scope: they are not a kubelet's. The node dashboard reads only
recording rules joining cAdvisor's series with kube-state-metrics' kube_pod_info; the
cAdvisor side of them is checked here. Series klet cannot serve, or that exist only after an
event this test does not cause, are listed in KNOWINGLY_ABSENT with the reason, and the
test proves they are indeed absent (so the list stays true).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode
from tests.harness.prometheus import Prometheus, kubelet_scrape_config
from tests.harness.waiting import wait_for

# A node, its pods and Prometheus start in the module's first test: more than the default
# per-test timeout allows on a loaded machine.
pytestmark = pytest.mark.timeout(300)

NODE = "kletprom1"
NAMESPACE = "default"
BUSY = "busy"
INTERVAL_S = 2

KUBELET = f'job="kubelet", metrics_path="/metrics", node="{NODE}"'
CADVISOR = f'job="kubelet", metrics_path="/metrics/cadvisor", node="{NODE}"'
PROBES = f'job="kubelet", metrics_path="/metrics/probes", node="{NODE}"'
POD = f'namespace="{NAMESPACE}", pod="{BUSY}"'
NS = f'namespace="{NAMESPACE}"'
# kube-prometheus's disk device selector and the mixin's container filesystem selector
DISK = 'device=~"(/dev/)?(mmcblk.p.+|nvme.+|rbd.+|sd.+|vd.+|xvd.+|dm-.+|md.+|dasd.+)"'

# dashboards/kubelet.libsonnet: the stat panels, the operation and latency graphs, the
# instance variable (up) and the process panels.
KUBELET_DASHBOARD = [
    f"up{{{KUBELET}}}",
    f"kubelet_node_name{{{KUBELET}}}",
    f"kubelet_running_pods{{{KUBELET}}}",
    f'kubelet_running_containers{{{KUBELET}, container_state="running"}}',
    f'volume_manager_total_volumes{{{KUBELET}, state="actual_state_of_world"}}',
    f'volume_manager_total_volumes{{{KUBELET}, state="desired_state_of_world"}}',
    f"kubelet_runtime_operations_total{{{KUBELET}}}",
    f"kubelet_runtime_operations_errors_total{{{KUBELET}}}",
    f"kubelet_runtime_operations_duration_seconds_bucket{{{KUBELET}}}",
    f"kubelet_pod_start_duration_seconds_count{{{KUBELET}}}",
    f"kubelet_pod_start_duration_seconds_bucket{{{KUBELET}}}",
    f"kubelet_pod_worker_duration_seconds_count{{{KUBELET}}}",
    f"kubelet_pod_worker_duration_seconds_bucket{{{KUBELET}}}",
    f"storage_operation_duration_seconds_count{{{KUBELET}}}",
    f"storage_operation_duration_seconds_bucket{{{KUBELET}}}",
    f"kubelet_cgroup_manager_duration_seconds_count{{{KUBELET}}}",
    f"kubelet_cgroup_manager_duration_seconds_bucket{{{KUBELET}}}",
    f"kubelet_pleg_relist_duration_seconds_count{{{KUBELET}}}",
    f"kubelet_pleg_relist_duration_seconds_bucket{{{KUBELET}}}",
    f"kubelet_pleg_relist_interval_seconds_bucket{{{KUBELET}}}",
    f'rest_client_requests_total{{{KUBELET}, code=~"2.."}}',
    f"rest_client_request_duration_seconds_bucket{{{KUBELET}}}",
    f"process_resident_memory_bytes{{{KUBELET}}}",
    f"process_cpu_seconds_total{{{KUBELET}}}",
]

# dashboards/resources/queries/pod.libsonnet (Compute Resources / Pod): the cAdvisor series
# it reads directly, for the busy pod, with its selectors (a container's, or the pod's
# network), and through node_namespace_pod_container:container_cpu_usage_seconds_total:
# sum_rate5m (rules/apps.libsonnet) the CPU counter of containers with an image.
POD_DASHBOARD = [
    f'container_cpu_usage_seconds_total{{{CADVISOR}, {POD}, container!="", image!=""}}',
    f'container_cpu_cfs_periods_total{{{CADVISOR}, {POD}, container!=""}}',
    f'container_cpu_cfs_throttled_periods_total{{{CADVISOR}, {POD}, container!=""}}',
    f'container_memory_working_set_bytes{{{CADVISOR}, {POD}, container!="", image!=""}}',
    f'container_memory_rss{{{CADVISOR}, {POD}, container!="", container!="POD"}}',
    f'container_memory_cache{{{CADVISOR}, {POD}, container!="", container!="POD"}}',
    f'container_memory_swap{{{CADVISOR}, {POD}, container!="", container!="POD"}}',
    f"container_network_receive_bytes_total{{{CADVISOR}, {POD}}}",
    f"container_network_transmit_bytes_total{{{CADVISOR}, {POD}}}",
    f"container_network_receive_packets_total{{{CADVISOR}, {POD}}}",
    f"container_network_transmit_packets_total{{{CADVISOR}, {POD}}}",
    f"container_network_receive_packets_dropped_total{{{CADVISOR}, {POD}}}",
    f"container_network_transmit_packets_dropped_total{{{CADVISOR}, {POD}}}",
]

# dashboards/resources/queries/namespace.libsonnet (Compute Resources / Namespace (Pods)):
# the same families summed over the namespace (network by the namespace label alone).
NAMESPACE_DASHBOARD = [
    f'container_memory_working_set_bytes{{{CADVISOR}, {NS}, container!="", image!=""}}',
    f'container_memory_rss{{{CADVISOR}, {NS}, container!=""}}',
    f'container_memory_cache{{{CADVISOR}, {NS}, container!=""}}',
    f'container_memory_swap{{{CADVISOR}, {NS}, container!=""}}',
    f"container_network_receive_bytes_total{{{CADVISOR}, {NS}}}",
    f"container_network_transmit_bytes_total{{{CADVISOR}, {NS}}}",
    f"container_network_receive_packets_total{{{CADVISOR}, {NS}}}",
    f"container_network_transmit_packets_total{{{CADVISOR}, {NS}}}",
    f"container_network_receive_packets_dropped_total{{{CADVISOR}, {NS}}}",
    f"container_network_transmit_packets_dropped_total{{{CADVISOR}, {NS}}}",
]

# Both dashboards' disk panels: block I/O by disk device of the pod's containers (the pod
# dashboard by pod and by container, the namespace dashboard summed over it). cAdvisor
# reads them from the cgroup's blkio (v1) or io.stat (v2) counters, which a kernel may not
# keep: under cgroup v1, Linux 6.x counts the I/O of a cgroup only once it has a blkio
# throttle limit (measured on these test machines, kernel 6.18: "Total 0" in every cgroup,
# the root's too, until a limit is set). The test reads the busy container's own counters
# and wants the series exactly when the kernel kept some.
BLOCK_IO = [
    f'{name}{{{CADVISOR}, {selector}, {DISK}, container!=""}}'
    for name in (
        "container_fs_reads_total",
        "container_fs_writes_total",
        "container_fs_reads_bytes_total",
        "container_fs_writes_bytes_total",
    )
    for selector in (POD, NS)
]

# dashboards/resources/queries/node.libsonnet (Compute Resources / Node (Pods)) reads only
# recording rules of rules/apps.libsonnet; their cAdvisor inputs, on this node:
NODE_DASHBOARD = [
    f'container_cpu_usage_seconds_total{{{CADVISOR}, image!=""}}',
    f'container_memory_working_set_bytes{{{CADVISOR}, image!=""}}',
    f'container_memory_rss{{{CADVISOR}, image!=""}}',
    f'container_memory_cache{{{CADVISOR}, image!=""}}',
    f'container_memory_swap{{{CADVISOR}, image!=""}}',
]

# alerts/kubelet.libsonnet (and the PLEG recording rule of rules/kubelet.libsonnet): the
# kubelet's side of KubeletTooManyPods, KubeletPlegDurationHigh,
# KubeletPodStartUpLatencyHigh, KubeletDown and KubeletTargetDown (up).
KUBELET_ALERTS = [
    f"kubelet_running_pods{{{KUBELET}}}",
    f"kubelet_node_name{{{KUBELET}}}",
    f"kubelet_pleg_relist_duration_seconds_bucket{{{KUBELET}}}",
    f"kubelet_pod_worker_duration_seconds_bucket{{{KUBELET}}}",
    f"up{{{KUBELET}}}",
]

# Not in kube-prometheus's dashboards but what the kubelet ServiceMonitor's third endpoint
# is for (the probe counts of upstream's /metrics/probes).
PROBES_ENDPOINT = [
    f'prober_probe_total{{{PROBES}, {POD}, probe_type="Readiness", result="successful"}}',
]

# Queried by the mixin, not served for this node, and why. Each is checked to be absent.
KNOWINGLY_ABSENT = {
    # kubelet dashboard, "Goroutines": Go runtime series; klet's agent is Python.
    f"go_goroutines{{{KUBELET}}}": "a Go runtime series: klet is written in Python",
    # kubelet dashboard, "Config Error Count": upstream removed it with dynamic kubelet
    # configuration (1.24); no kubelet of a supported release serves it.
    f"kubelet_node_config_error{{{KUBELET}}}": "removed upstream with dynamic kubelet config",
    # kubelet dashboard, "Storage Operation Error Rate": kube-prometheus's relabelling drops it.
    f"storage_operation_errors_total{{{KUBELET}}}": "dropped by kube-prometheus's relabelling",
    # KubeNodeEviction: a counter per eviction signal, created at a node's first
    # eviction, as upstream's (tests/integration/test_eviction.py covers it).
    f"kubelet_evictions{{{KUBELET}}}": "exists only once the node has evicted a pod",
    # KubeletClientCertificateExpiration / KubeletServerCertificateExpiration: served
    # while the certificate is rotated (rotateCertificates, serverTLSBootstrap), as
    # upstream's; this node has static certificates (tests/cluster/test_tls_bootstrap.py
    # covers them and the renewal counters below).
    f"kubelet_certificate_manager_client_ttl_seconds{{{KUBELET}}}": "only with rotateCertificates",
    f"kubelet_certificate_manager_server_ttl_seconds{{{KUBELET}}}": "only with serverTLSBootstrap",
    # KubeletClientCertificateRenewalErrors / KubeletServerCertificateRenewalErrors: the
    # failed renewals, counted likewise only where certificates are rotated.
    f"kubelet_certificate_manager_client_expiration_renew_errors{{{KUBELET}}}": "no rotation",
    f"kubelet_server_expiration_renew_errors{{{KUBELET}}}": "no rotation",
}

BUSY_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": BUSY, "namespace": NAMESPACE},
    "spec": {
        "nodeName": NODE,
        "containers": [
            {
                "name": "spin",
                "image": "registry.klet.test/busybox:1.36",
                # Direct I/O reaches the block device in the container's own cgroup (buffered
                # writes are flushed by the kernel, outside it, under cgroup v1).
                "command": [
                    "sh",
                    "-c",
                    "dd if=/dev/zero of=/scratch/f bs=4096 count=64 oflag=direct"
                    " && dd if=/scratch/f of=/dev/null bs=4096 iflag=direct"
                    " && while :; do :; done",
                ],
                "resources": {"limits": {"cpu": "200m", "memory": "64Mi"}},
                "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    },
}

MISSING_IMAGE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "no-such-image", "namespace": NAMESPACE},
    "spec": {
        "nodeName": NODE,
        "containers": [{"name": "main", "image": "registry.klet.test/no-such-image:1"}],
    },
}

# What kube-prometheus grants its Prometheus (prometheus-k8s) that a kubelet checks.
SCRAPER_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "klet-prometheus-test"},
    "rules": [
        {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
    ],
}
SCRAPER_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "klet-prometheus-test"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "klet-prometheus-test",
    },
    "subjects": [{"kind": "ServiceAccount", "name": "prometheus-test", "namespace": NAMESPACE}],
}
SCRAPER_ACCOUNT = {
    "apiVersion": "v1",
    "kind": "ServiceAccount",
    "metadata": {"name": "prometheus-test", "namespace": NAMESPACE},
}


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("promnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        control_plane.apply([BUSY_POD, MISSING_IMAGE_POD])
        yield kletnode


@pytest.fixture(scope="module")
def prometheus(
    node: KletNode, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    cp = control_plane
    cp.apply([SCRAPER_ROLE, SCRAPER_BINDING, SCRAPER_ACCOUNT])
    dir: Path = tmp_path_factory.mktemp("prometheus")
    token = dir / "token"
    created = cp.kubectl(
        "-n", NAMESPACE, "create", "token", "prometheus-test", "--duration=1h", check=True
    )
    token.write_text(created.stdout.strip())
    config = kubelet_scrape_config(
        address=f"127.0.0.1:{node.kubelet_port}", node=NODE, token_file=token, interval_s=INTERVAL_S
    )
    prom = Prometheus(dir, config)
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()
        cp.kubectl("delete", "clusterrolebinding,clusterrole", "klet-prometheus-test")
        cp.kubectl("-n", NAMESPACE, "delete", "serviceaccount", "prometheus-test")


def missing(prom: Prometheus, selectors: list[str]) -> list[str]:
    return [s for s in selectors if not prom.query(s)]


def kernel_counted_block_io(cgroup: str) -> bool:
    """Whether the kernel kept block I/O counters by device for `cgroup` (cAdvisor's `id`
    label: its path below each hierarchy's mount point), v1 or v2."""
    relative = cgroup.lstrip("/")
    v1 = Path("/sys/fs/cgroup/blkio", relative, "blkio.throttle.io_service_bytes_recursive")
    v2 = Path("/sys/fs/cgroup", relative, "io.stat")
    assert v1.parent.is_dir() or v2.parent.is_dir(), f"no cgroup {cgroup} on this host"
    if v1.exists():
        return any(line.split()[0] != "Total" for line in v1.read_text().splitlines() if line)
    return v2.exists() and bool(v2.read_text().strip())


def test_dashboards_and_alerts_have_their_kubelet_series(prometheus: Prometheus) -> None:
    began = time.monotonic()

    errors: list[str] = []

    def all_up() -> bool:
        targets = prometheus.targets()
        errors[:] = [f"{t['scrapeUrl']}: {t['lastError']}" for t in targets if t["lastError"]]
        return len(targets) == 3 and all(t["health"] == "up" for t in targets)

    wait_for(all_up, timeout_s=30, what=f"the three kubelet endpoints up (errors: {errors})")
    wanted = [
        *KUBELET_DASHBOARD,
        *POD_DASHBOARD,
        *NAMESPACE_DASHBOARD,
        *NODE_DASHBOARD,
        *KUBELET_ALERTS,
        *PROBES_ENDPOINT,
    ]
    # Some series need a few scrapes (rates of the pod's first seconds, the failed
    # pulls' back-off); what is still missing after a minute is named.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not missing(prometheus, wanted), timeout_s=60, what="every series")
    absent = missing(prometheus, wanted)
    assert not absent, "not served: " + "\n".join(absent)
    for selector, why in KNOWINGLY_ABSENT.items():
        assert prometheus.query(selector) == [], f"{selector} is served, yet listed absent: {why}"

    # the disk panels' series, exactly when the kernel counted the busy container's I/O
    (spin,) = prometheus.query(
        f'container_cpu_usage_seconds_total{{{CADVISOR}, {POD}, container="spin"}}'
    )
    if kernel_counted_block_io(spin["metric"]["id"]):
        wait_for(lambda: not missing(prometheus, BLOCK_IO), timeout_s=30, what="block I/O series")
    else:
        served = [s for s in BLOCK_IO if prometheus.query(s)]
        assert served == [], f"served although the kernel counted no block I/O: {served}"

    # cAdvisor's CPU counter of the busy container grows: its rate is above zero
    rate = (
        f'rate(container_cpu_usage_seconds_total{{{CADVISOR}, {POD}, container="spin"}}'
        f"[{5 * INTERVAL_S}s])"
    )
    wait_for(
        lambda: any(float(r["value"][1]) > 0 for r in prometheus.query(rate)),
        timeout_s=30,
        what=f"{rate} > 0",
    )
    print(f"series present after {time.monotonic() - began:.1f} s")

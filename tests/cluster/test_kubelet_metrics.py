"""One scrape of the node's kubelet API gives every service's kubelet metrics, as one
scrape of upstream's kubelet does.

A klet node joined to the real control plane runs a pod (from the apiserver, so it has
the creationTimestamp the start SLI is measured from) with an emptyDir and a readiness
probe. A client certificate in system:masters (authorized by the apiserver's
SubjectAccessReview, as Prometheus's token would be for nodes/metrics) scrapes 10250's
`/metrics`: the leading replica of each of the five services shows in it
(`klet_leader{service}` 1) with series of its own: syncloop's PLEG, pod worker, pod
start, started pods and containers and volume manager; pod-source's snapshots;
eviction's passes; image-gc's image count; status-reporter's `kubelet_node_name`; the
apiserver requests of the services (`rest_client_requests_total`) and the runtime
operations, each family once, no `_created` series and no prober series. `/metrics/probes`
carries the pod's `prober_probe_total`, and the read-only port serves the same pages.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from klet.devstack import DevStack
from klet.testbed.cluster import ControlPlane
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.clusternode import cluster_node
from tests.harness.node import KletNode, sample_value
from tests.harness.waiting import wait_for
from tools.upstream_metrics_accounts import ENDPOINTS, account, upstream_metrics

NODE = "kletmetrics1"
SERVICES = ("pod-source", "syncloop", "status-reporter", "eviction", "image-gc")

PROBED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "probed", "namespace": "default"},
    "spec": {
        "nodeName": NODE,
        "containers": [
            {
                "name": "main",
                "image": "registry.klet.test/busybox:1.36",
                "command": ["sleep", "100000"],
                "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    },
}


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, devstack: DevStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KletNode]:
    base = tmp_path_factory.mktemp("metricsnode")
    with cluster_node(control_plane, devstack, base, name=NODE) as kletnode:
        control_plane.apply([PROBED])
        yield kletnode


def client_context(cp: ControlPlane) -> ssl.SSLContext:
    """TLS as a cluster-admin client: the node's serving certificate is the cluster CA's."""
    pair = cp.ca.issue("klet-metrics-scraper", ["system:masters"], client=True, name="scraper")
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.check_hostname = False  # the serving certificate names the node and 127.0.0.1
    ctx.load_cert_chain(str(pair.cert), str(pair.key))
    return ctx


def scrape(url: str, ctx: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(resp.read().decode())


def every_service_shows(text: str) -> list[str]:
    """What the page lacks of the five services' metrics (empty: nothing)."""
    missing = [
        f"klet_leader{{service={s}}}"
        for s in SERVICES
        if sample_value(text, "klet_leader", service=s) != 1.0
    ]
    wanted = {
        # syncloop
        "kubelet_pleg_relist_duration_seconds_count": {},
        "kubelet_pod_worker_duration_seconds_count": {"operation_type": "create"},
        "kubelet_pod_start_duration_seconds_count": {},
        "kubelet_pod_start_sli_duration_seconds_count": {},
        "kubelet_started_pods_total": {},
        "kubelet_started_containers_total": {"container_type": "container"},
        "volume_manager_total_volumes": {"plugin_name": "kubernetes.io/empty-dir"},
        "kubelet_running_pods": {},
        # pod-source
        "klet_pod_source_snapshots_total": {"source": "file"},
        # eviction
        "klet_eviction_passes_total": {},
        # image-gc
        "klet_image_gc_images": {},
        # status-reporter
        "kubelet_node_name": {"node": NODE},
        "kubelet_running_containers": {"container_state": "running"},
        # several: summed over the services
        "rest_client_requests_total": {"code": "200"},
        "kubelet_runtime_operations_total": {},
    }
    for name, labels in wanted.items():
        value = sample_value(text, name, **labels)
        if value is None or (name.endswith(("_count", "_total")) and value < 1):
            missing.append(f"{name}{labels}={value}")
    if sample_value(text, "klet_metrics_scrape_failures_total") is None:
        missing.append("klet_metrics_scrape_failures_total")
    return missing


def test_one_scrape_has_every_services_metrics(node: KletNode, control_plane: ControlPlane) -> None:
    url = f"https://127.0.0.1:{node.kubelet_port}"
    ctx = client_context(control_plane)
    last: list[str] = []

    def complete() -> bool:
        last[:] = every_service_shows(scrape(f"{url}/metrics", ctx))
        return not last

    wait_for(complete, timeout_s=90, what=f"every service's metrics on 10250 (missing: {last})")
    text = scrape(f"{url}/metrics", ctx)
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names)), "a family twice"
    assert "_created" not in text
    assert "prober_probe_total" not in text
    # every scraped service answered in time
    for reason in ("timeout", "error"):
        assert sample_value(text, "klet_metrics_scrape_failures_total", reason=reason) == 0.0
    list(text_string_to_metric_families(text))  # one valid exposition

    def probed() -> float | None:
        page = scrape(f"{url}/metrics/probes", ctx)
        return sample_value(
            page,
            "prober_probe_total",
            probe_type="Readiness",
            result="successful",
            pod="probed",
            container="main",
        )

    wait_for(lambda: (probed() or 0) >= 1, timeout_s=30, what="prober_probe_total on 10250")
    probes = scrape(f"{url}/metrics/probes", ctx)
    assert "kubelet_running_pods" not in probes

    # the read-only port serves the same pages
    plain = f"http://127.0.0.1:{node.read_only_port}"
    assert every_service_shows(scrape(f"{plain}/metrics")) == []
    assert sample_value(scrape(f"{plain}/metrics/probes"), "prober_probe_total") is not None


def page(url: str, ctx: ssl.SSLContext) -> str:
    """The page, or "" where klet serves none (404): its metrics must be accounted."""
    try:
        return scrape(url, ctx)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return ""
        raise


def served_families(text: str) -> set[str]:
    """Every family name a page declares, with a counter's `_total` as it is scraped."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "counter" and not name.endswith("_total"):
                names.add(f"{name}_total")
    return names


def test_upstream_metric_names_served_or_accounted(
    node: KletNode, control_plane: ControlPlane
) -> None:
    """Every metric upstream's kubelet serves (tools/upstream_metrics.json) is on the same
    page here once a pod ran, unless tools/upstream_metrics_accounts.py says why not."""
    url = f"https://127.0.0.1:{node.kubelet_port}"
    ctx = client_context(control_plane)
    wait_for(
        lambda: sample_value(scrape(f"{url}/metrics", ctx), "kubelet_started_pods_total"),
        timeout_s=90,
        what="the pod started",
    )
    pages = {endpoint: served_families(page(f"{url}{endpoint}", ctx)) for endpoint in ENDPOINTS}
    missing = [
        f"{m.endpoint} {m.name}"
        for m in upstream_metrics()
        if m.name not in pages[m.endpoint] and account(m) is None
    ]
    assert missing == []
    stale = [
        f"{m.endpoint} {m.name}"
        for m in upstream_metrics()
        if m.name in pages[m.endpoint] and account(m) is not None
    ]
    assert stale == [], "served, yet accounted as not served"

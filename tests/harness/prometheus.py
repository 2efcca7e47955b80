"""A real Prometheus (Debian's `prometheus` package, which `make setup` installs) scraping a
klet node's kubelet API the way kube-prometheus's kubelet ServiceMonitor has
prometheus-operator scrape every kubelet, queried over its HTTP API.

`kubelet_scrape_config` writes the three endpoints of that ServiceMonitor as plain
`scrape_configs` (no Kubernetes service discovery: the node's address is known): HTTPS to
the kubelet port with a bearer token file and no verification of the serving certificate,
`honor_labels`, paths `/metrics`, `/metrics/cadvisor` (without honouring timestamps) and
`/metrics/probes`, the target labels the operator's relabelling gives a kubelet endpoint
(`job="kubelet"` from the Service's `app.kubernetes.io/name`, `namespace`, `service`,
`endpoint`, `node`, and `metrics_path` from `__metrics_path__`), and the metric drops
kube-prometheus applies to each endpoint. Written from reading kube-prometheus
(jsonnet/kube-prometheus/components/k8s-control-plane.libsonnet and
addons/dropping-deprecated-metrics-relabelings.libsonnet); the drop lists keep only the
names a kubelet could serve (the apiserver, scheduler and etcd names cannot match).

`Prometheus` runs the binary on a free port of 127.0.0.1 with a private data directory
and stops it by PID.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from klet.devstack import ManagedProcess, free_port

BINARY = "prometheus"

# kube-prometheus's endpoint-wide drops that can match a kubelet's names: the
# kubelet_* latency families renamed long ago, the docker-shim families, the reflector
# families, and the storage/rest-client families listed among "other deprecated" ones.
_DEPRECATED_KUBELET = (
    "kubelet_(pod_worker_latency_microseconds|pod_start_latency_microseconds"
    "|cgroup_manager_latency_microseconds|pod_worker_start_latency_microseconds"
    "|pleg_relist_latency_microseconds|pleg_relist_interval_microseconds|runtime_operations"
    "|runtime_operations_latency_microseconds|runtime_operations_errors"
    "|eviction_stats_age_microseconds|device_plugin_registration_count"
    "|device_plugin_alloc_latency_microseconds|network_plugin_operations_latency_microseconds)"
)
_DOCKER = (
    "kubelet_docker_(operations|operations_latency_microseconds|operations_errors"
    "|operations_timeout)"
)
_REFLECTOR = (
    "reflector_(items_per_list|items_per_watch|list_duration_seconds|lists_total"
    "|short_watches_total|watch_duration_seconds|watches_total)"
)
_OTHER = (
    "(rest_client_request_latency_seconds|storage_operation_errors_total"
    "|storage_operation_status_count)"
)

# The cAdvisor endpoint's own drops: series cAdvisor sends although they are disabled;
# static or per-system-service series of cgroups outside any pod (no pod and no
# namespace label); block I/O per device of single containers.
_CADVISOR_DISABLED = (
    "container_(network_tcp_usage_total|network_udp_usage_total|tasks_state|cpu_load_average_10s)"
)
_CADVISOR_NO_POD = (
    "(container_spec_.*|container_file_descriptors|container_sockets|container_threads_max"
    "|container_threads|container_start_time_seconds|container_last_seen);;"
)
_CADVISOR_PER_CONTAINER = "(container_blkio_device_usage_total);.+"


def _drop(regex: str, *labels: str) -> dict[str, Any]:
    return {"source_labels": list(labels or ("__name__",)), "regex": regex, "action": "drop"}


def kubelet_scrape_config(
    *, address: str, node: str, token_file: Path, interval_s: float
) -> dict[str, Any]:
    """The `scrape_configs` of kube-prometheus's kubelet ServiceMonitor for the kubelet at
    `address` (host:port) of `node`, with `token_file` as the bearer token."""
    endpoints = [
        ("/metrics", True, [_drop(r) for r in (_DEPRECATED_KUBELET, _DOCKER, _REFLECTOR, _OTHER)]),
        (
            "/metrics/cadvisor",
            False,
            [
                _drop(_CADVISOR_DISABLED),
                _drop(_CADVISOR_NO_POD, "__name__", "pod", "namespace"),
                _drop(_CADVISOR_PER_CONTAINER, "__name__", "container"),
            ],
        ),
        ("/metrics/probes", True, []),
    ]
    target_labels = {
        "job": "kubelet",
        "namespace": "kube-system",
        "service": "kubelet",
        "endpoint": "https-metrics",
        "node": node,
    }
    jobs = []
    for index, (path, honor_timestamps, drops) in enumerate(endpoints):
        relabel: list[dict[str, Any]] = [
            {"target_label": label, "replacement": value} for label, value in target_labels.items()
        ]
        relabel.append({"source_labels": ["__metrics_path__"], "target_label": "metrics_path"})
        jobs.append(
            {
                # prometheus-operator's job names; the job label is set by relabelling
                "job_name": f"serviceMonitor/monitoring/kubelet/{index}",
                "scrape_interval": f"{interval_s}s",
                "scrape_timeout": f"{interval_s}s",
                "scheme": "https",
                "metrics_path": path,
                "honor_labels": True,
                "honor_timestamps": honor_timestamps,
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "tls_config": {"insecure_skip_verify": True},
                "static_configs": [{"targets": [address]}],
                "relabel_configs": relabel,
                "metric_relabel_configs": drops,
            }
        )
    return {"scrape_configs": jobs}


class Prometheus:
    """Debian's Prometheus with `config` (a dict, written as JSON, which is YAML), on a free
    port with its data under `dir`."""

    def __init__(self, dir: Path, config: dict[str, Any]) -> None:
        binary = shutil.which(BINARY)
        if binary is None:
            raise FileNotFoundError(f"{BINARY} not on PATH: `make setup` installs Debian's package")
        self.dir = dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        dir.mkdir(parents=True, exist_ok=True)
        config_file = dir / "prometheus.yml"
        config_file.write_text(json.dumps(config, indent=1))
        self.proc = ManagedProcess(
            "prometheus",
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            dir=dir,
        )

    def start(self) -> None:
        self.proc.start()
        self.proc.wait_ready(self._ready, 30, "/-/ready")

    def stop(self) -> None:
        self.proc.stop()

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
            return bool(r.status == 200)

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            body = json.loads(r.read().decode())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now: [{"metric": labels, "value": [t, v]}]."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr} is a {data['resultType']}, not an instant vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active targets: scrapeUrl, health ("up", "down", "unknown"), lastError."""
        active: list[dict[str, Any]] = self._get("/api/v1/targets", state="active")["activeTargets"]
        return active

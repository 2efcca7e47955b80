"""KubeletConfiguration: upstream defaults, strict file loading and validation.

Covers: the defaults of upstream's SetDefaults_KubeletConfiguration (including the
cross-field ones: nodeStatusReportFrequency, serializeImagePulls, evictionHard and
mergeDefaultEvictionSettings), the zero-means-unset rule of non-pointer fields, YAML and
JSON files, relative paths resolved against the file's directory, the collection of every
problem (apiVersion/kind, unknown and duplicate fields, wrong types, invalid values) with
file and field path, `validate()` rules, the /configz round trip, and which fields a
file set (for settings that fall back to a file field).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from klet.config import (
    DEFAULT_EVICTION_HARD,
    ConfigError,
    KubeletConfiguration,
    decode_config,
    load_config_file,
    upstream_name,
    validate,
)

HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def write(tmp_path: Path, body: str, name: str = "kubelet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body if name.endswith(".yaml") else body)
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    prefix = f"{path}: "
    assert all(p.startswith(prefix) for p in info.value.problems), info.value.problems
    return [p.removeprefix(prefix) for p in info.value.problems]


DEFAULTS: list[tuple[str, Any]] = [
    ("static_pod_path", ""),
    ("static_pod_url", ""),
    ("static_pod_url_header", {}),
    ("file_check_frequency", 20.0),
    ("http_check_frequency", 20.0),
    ("sync_frequency", 60.0),
    ("address", "0.0.0.0"),
    ("port", 10250),
    ("read_only_port", 0),
    ("healthz_port", 10248),
    ("healthz_bind_address", "127.0.0.1"),
    ("tls_cert_file", ""),
    ("tls_private_key_file", ""),
    ("authentication.anonymous.enabled", False),
    ("authentication.webhook.enabled", True),
    ("authentication.webhook.cache_ttl", 120.0),
    ("authentication.x509.client_ca_file", ""),
    ("authorization.mode", "Webhook"),
    ("authorization.webhook.cache_authorized_ttl", 300.0),
    ("authorization.webhook.cache_unauthorized_ttl", 30.0),
    ("cluster_domain", ""),
    ("cluster_dns", ()),
    ("resolv_conf", "/etc/resolv.conf"),
    ("container_runtime_endpoint", "unix:///run/containerd/containerd.sock"),
    ("image_service_endpoint", ""),
    ("runtime_request_timeout", 120.0),
    ("pod_logs_dir", "/var/log/pods"),
    ("max_pods", 110),
    ("pod_pids_limit", -1),
    ("cgroup_driver", "cgroupfs"),
    ("cgroups_per_qos", True),
    ("cgroup_root", ""),
    ("cpu_cfs_quota", True),
    ("cpu_cfs_quota_period", 0.1),
    ("serialize_image_pulls", True),
    ("max_parallel_image_pulls", None),
    ("registry_pull_qps", 5),
    ("registry_burst", 10),
    ("event_record_qps", 50),
    ("event_burst", 100),
    ("kube_api_qps", 50),
    ("kube_api_burst", 100),
    ("node_status_update_frequency", 10.0),
    ("node_status_report_frequency", 300.0),
    ("node_lease_duration_seconds", 40),
    ("node_status_max_images", 50),
    ("image_minimum_gc_age", 120.0),
    ("image_maximum_gc_age", 0.0),
    ("image_gc_high_threshold_percent", 85),
    ("image_gc_low_threshold_percent", 80),
    ("eviction_hard", dict(DEFAULT_EVICTION_HARD)),
    ("eviction_soft", {}),
    ("eviction_soft_grace_period", {}),
    ("eviction_pressure_transition_period", 300.0),
    ("eviction_max_pod_grace_period", 0),
    ("eviction_minimum_reclaim", {}),
    ("kube_reserved", {}),
    ("system_reserved", {}),
    ("enforce_node_allocatable", ("pods",)),
    ("register_node", True),
    ("register_with_taints", ()),
    ("provider_id", ""),
    ("container_log_max_size", "10Mi"),
    ("container_log_max_files", 5),
    ("crash_loop_back_off.max_container_restart_period", 300.0),
    ("pod_housekeeping_period", 2.0),
    ("fail_swap_on", True),
    ("feature_gates", {}),
    ("enable_server", True),
    ("enable_debugging_handlers", True),
    ("shutdown_grace_period", 0.0),
    ("oom_score_adj", -999),
    ("logging.format", "text"),
    ("logging.flush_frequency", 5.0),
]


def attr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize(("path", "value"), DEFAULTS)
def test_defaults_match_upstream(path: str, value: Any) -> None:
    assert attr(KubeletConfiguration(), path) == value


def test_eviction_hard_default_values() -> None:
    assert KubeletConfiguration().eviction_hard == {
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%",
    }


def test_minimal_file_gives_defaults_and_is_valid(tmp_path: Path) -> None:
    assert load_config_file(write(tmp_path, "")) == KubeletConfiguration()
    assert validate(KubeletConfiguration()) == []


@pytest.mark.parametrize(
    ("path", "upstream"),
    [
        ("static_pod_path", "staticPodPath"),
        ("static_pod_url", "staticPodURL"),
        ("static_pod_url_header", "staticPodURLHeader"),
        ("kube_api_qps", "kubeAPIQPS"),
        ("cluster_dns", "clusterDNS"),
        ("cpu_cfs_quota_period", "cpuCFSQuotaPeriod"),
        ("image_gc_high_threshold_percent", "imageGCHighThresholdPercent"),
        ("provider_id", "providerID"),
        ("authentication.x509.client_ca_file", "authentication.x509.clientCAFile"),
        ("authentication.webhook.cache_ttl", "authentication.webhook.cacheTTL"),
        (
            "crash_loop_back_off.max_container_restart_period",
            "crashLoopBackOff.maxContainerRestartPeriod",
        ),
    ],
)
def test_upstream_names(path: str, upstream: str) -> None:
    assert upstream_name(path) == upstream


def test_full_file_is_decoded(tmp_path: Path) -> None:
    cfg = load_config_file(
        write(
            tmp_path,
            """
staticPodPath: /etc/kubernetes/manifests
staticPodURL: https://example.test/pods
staticPodURLHeader:
  Authorization: ["Bearer x"]
fileCheckFrequency: 1m30s
syncFrequency: 10s
address: 127.0.0.1
port: 20250
readOnlyPort: 10255
cpuCFSQuotaPeriod: 50ms
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
maxPods: 50
podPidsLimit: 4096
registryPullQPS: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false, cacheTTL: 1m}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: 1Gi}
evictionSoft: {memory.available: 2Gi}
evictionSoftGracePeriod: {memory.available: 1m30s}
kubeReserved: {cpu: 100m, memory: 1Gi}
featureGates: {EventedPLEG: false}
registerWithTaints:
  - {key: dedicated, value: infra, effect: NoSchedule}
crashLoopBackOff: {maxContainerRestartPeriod: 1m}
logging: {format: json, flushFrequency: 1000000000, verbosity: 3}
""",
        )
    )
    assert cfg.static_pod_path == "/etc/kubernetes/manifests"
    assert cfg.static_pod_url_header == {"Authorization": ("Bearer x",)}
    assert cfg.file_check_frequency == 90.0
    assert cfg.sync_frequency == 10.0
    assert (cfg.address, cfg.port, cfg.read_only_port) == ("127.0.0.1", 20250, 10255)
    assert cfg.cpu_cfs_quota_period == pytest.approx(0.05)
    assert cfg.cluster_dns == ("10.96.0.10",)
    assert (cfg.max_pods, cfg.pod_pids_limit, cfg.registry_pull_qps) == (50, 4096, 0)
    assert cfg.authentication.anonymous.enabled is True
    assert cfg.authentication.webhook.enabled is False
    assert cfg.authentication.webhook.cache_ttl == 60.0
    assert cfg.authorization.mode == "AlwaysAllow"
    assert cfg.authorization.webhook.cache_authorized_ttl == 300.0
    assert cfg.eviction_hard == {"memory.available": "1Gi"}
    assert cfg.eviction_soft_grace_period == {"memory.available": 90.0}
    assert cfg.kube_reserved == {"cpu": "100m", "memory": "1Gi"}
    assert cfg.feature_gates == {"EventedPLEG": False}
    assert cfg.register_with_taints[0]["effect"] == "NoSchedule"
    assert cfg.crash_loop_back_off.max_container_restart_period == 60.0
    assert (cfg.logging.format, cfg.logging.flush_frequency, cfg.logging.verbosity) == (
        "json",
        1.0,
        3,
    )


def test_json_file(tmp_path: Path) -> None:
    body = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "maxPods": 20,
        "syncFrequency": "30s",
    }
    cfg = load_config_file(write(tmp_path, json.dumps(body), name="kubelet.json"))
    assert (cfg.max_pods, cfg.sync_frequency) == (20, 30.0)


@pytest.mark.parametrize(
    ("body", "path", "value"),
    [
        # Plain (non-pointer) upstream fields: zero means "unset" and gets the default.
        ("port: 0", "port", 10250),
        ("maxPods: 0", "max_pods", 110),
        ('syncFrequency: "0s"', "sync_frequency", 60.0),
        ('address: ""', "address", "0.0.0.0"),
        ('cgroupDriver: ""', "cgroup_driver", "cgroupfs"),
        # Pointer fields keep an explicit zero.
        ("healthzPort: 0", "healthz_port", 0),
        ("registryPullQPS: 0", "registry_pull_qps", 0),
        ("imageGCLowThresholdPercent: 0", "image_gc_low_threshold_percent", 0),
        ("registerNode: false", "register_node", False),
        ('resolvConf: ""', "resolv_conf", ""),
        # null is "not set".
        ("port: null", "port", 10250),
        # enforceNodeAllocatable: [] and evictionHard: {} disable the defaults.
        ("enforceNodeAllocatable: []", "enforce_node_allocatable", ()),
        ("evictionHard: {}", "eviction_hard", {}),
        # negative podPidsLimit is normalized to -1
        ("podPidsLimit: -5", "pod_pids_limit", -1),
    ],
)
def test_zero_and_null_values(tmp_path: Path, body: str, path: str, value: Any) -> None:
    assert attr(load_config_file(write(tmp_path, body + "\n")), path) == value


@pytest.mark.parametrize(
    ("body", "update", "report"),
    [
        ("", 10.0, 300.0),
        ("nodeStatusUpdateFrequency: 4s", 4.0, 4.0),
        ("nodeStatusUpdateFrequency: 4s\nnodeStatusReportFrequency: 1m", 4.0, 60.0),
        ("nodeStatusReportFrequency: 1m", 10.0, 60.0),
    ],
)
def test_node_status_report_frequency_follows_update(
    tmp_path: Path, body: str, update: float, report: float
) -> None:
    cfg = load_config_file(write(tmp_path, body + "\n"))
    assert (cfg.node_status_update_frequency, cfg.node_status_report_frequency) == (update, report)


@pytest.mark.parametrize(
    ("body", "serialize"),
    [
        ("", True),
        ("maxParallelImagePulls: 1", True),
        ("maxParallelImagePulls: 4", False),
        ("serializeImagePulls: false", False),
        ("serializeImagePulls: false\nmaxParallelImagePulls: 4", False),
    ],
)
def test_serialize_image_pulls_default(tmp_path: Path, body: str, serialize: bool) -> None:
    assert load_config_file(write(tmp_path, body + "\n")).serialize_image_pulls is serialize


def test_merge_default_eviction_settings(tmp_path: Path) -> None:
    body = "mergeDefaultEvictionSettings: true\nevictionHard: {memory.available: 1Gi}\n"
    cfg = load_config_file(write(tmp_path, body))
    assert cfg.eviction_hard == {**DEFAULT_EVICTION_HARD, "memory.available": "1Gi"}


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    body = """
staticPodPath: manifests
tlsCertFile: pki/kubelet.crt
tlsPrivateKeyFile: /abs/kubelet.key
resolvConf: resolv.conf
authentication: {x509: {clientCAFile: ca.crt}}
"""
    path = tmp_path / "etc" / "kubelet.yaml"
    path.write_text(HEADER + body)
    cfg = load_config_file(path)
    base = tmp_path / "etc"
    assert cfg.static_pod_path == str(base / "manifests")
    assert cfg.tls_cert_file == str(base / "pki/kubelet.crt")
    assert cfg.tls_private_key_file == "/abs/kubelet.key"
    assert cfg.resolv_conf == str(base / "resolv.conf")
    assert cfg.authentication.x509.client_ca_file == str(base / "ca.crt")


def test_every_problem_is_reported_with_file_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
fileCheckFrequency: abc
evictionHard:
  memory.available: 10Zz
unknownField: 1
maxPods: many
registerNode: "yes"
authentication:
  webhook: {cacheTTL: 5, extra: 1}
imageGCHighThresholdPercent: 50
imageGCLowThresholdPercent: 60
cgroupDriver: upstart
containerRuntimeEndpoint: /run/containerd/containerd.sock
port: 70000
""",
    )
    assert problems_of(path) == [
        'fileCheckFrequency: invalid duration "abc"',
        "unknownField: unknown field",
        'maxPods: must be an integer, got "many"',
        'registerNode: must be a boolean, got "yes"',
        'authentication.webhook.cacheTTL: invalid duration 5: must be a string like "1m30s"',
        "authentication.webhook.extra: unknown field",
        "port: must be between 1 and 65535, got 70000",
        "containerRuntimeEndpoint: must be a unix:///path or tcp://host:port URL, "
        "got '/run/containerd/containerd.sock'",
        "imageGCLowThresholdPercent: must be less than imageGCHighThresholdPercent (60 >= 50)",
        "cgroupDriver: must be one of cgroupfs, systemd; got 'upstart'",
        'evictionHard.memory.available: invalid quantity "10Zz"',
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "kind: KubeletConfiguration\n",
            ['apiVersion: must be "kubelet.config.k8s.io/v1beta1" (missing)'],
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            [
                'apiVersion: must be "kubelet.config.k8s.io/v1beta1" '
                '(got "kubelet.config.k8s.io/v1alpha1")'
            ],
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
            ['kind: must be "KubeletConfiguration" (got "KubeProxyConfiguration")'],
        ),
        ("", ["the file is empty"]),
        ("- a\n- b\n", ["the file must hold a KubeletConfiguration object, got a list"]),
        (HEADER + "port: 1\nport: 2\n", ['line 4: duplicate field "port"']),
    ],
)
def test_document_level_problems(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(text)
    assert problems_of(path) == expected


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.yaml"
    path.write_text(HEADER + "port: [1\n")
    [problem] = problems_of(path)
    assert problem.startswith("cannot parse: ")
    [missing] = problems_of(tmp_path / "absent.yaml")
    assert missing.startswith("cannot read: ")


def test_duplicate_json_field(tmp_path: Path) -> None:
    text = (
        '{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",'
        ' "port": 1, "port": 2}'
    )
    assert problems_of(write(tmp_path, text, name="kubelet.json")) == ['duplicate field "port"']


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"port": 0}, "port: must be between 1 and 65535, got 0"),
        ({"read_only_port": 65536}, "readOnlyPort: must be between 0 and 65535, got 65536"),
        ({"healthz_port": -1}, "healthzPort: must be between 0 and 65535, got -1"),
        ({"address": "localhost"}, "address: invalid IP address 'localhost'"),
        (
            {"image_gc_high_threshold_percent": 101},
            "imageGCHighThresholdPercent: must be between 0 and 100, got 101",
        ),
        ({"max_pods": -1}, "maxPods: must not be negative, got -1"),
        ({"sync_frequency": 0.0}, "syncFrequency: must be a positive duration, got 0s"),
        (
            {"file_check_frequency": -1.0},
            "fileCheckFrequency: must be a positive duration, got -1s",
        ),
        (
            {"cgroup_driver": "upstart"},
            "cgroupDriver: must be one of cgroupfs, systemd; got 'upstart'",
        ),
        (
            {"container_runtime_endpoint": "tcp://host"},
            "containerRuntimeEndpoint: must be a unix:///path or tcp://host:port URL, got 'tcp://host'",
        ),
        (
            {"image_service_endpoint": "http://x:1"},
            "imageServiceEndpoint: must be a unix:///path or tcp://host:port URL, got 'http://x:1'",
        ),
        ({"node_lease_duration_seconds": 0}, "nodeLeaseDurationSeconds: must be greater than 0"),
        ({"cpu_cfs_quota_period": 2.0}, "cpuCFSQuotaPeriod: must be between 1ms and 1s"),
        (
            {"cgroup_root": "kubepods"},
            "cgroupRoot: must be an absolute cgroup path, not 'kubepods'",
        ),
        (
            {"eviction_hard": {"memory.available": "110%"}},
            "evictionHard.memory.available: percentage must be between 0% and 100%, got '110%'",
        ),
        (
            {"eviction_hard": {"memory.free": "1Gi"}},
            "evictionHard.memory.free: unsupported eviction signal",
        ),
        (
            {"eviction_hard": {"memory.available": "-1Gi"}},
            "evictionHard.memory.available: must not be negative, got '-1Gi'",
        ),
        (
            {"eviction_soft": {"memory.available": "1Gi"}},
            "evictionSoft.memory.available: needs a grace period in evictionSoftGracePeriod",
        ),
        ({"kube_reserved": {"memory": "lots"}}, 'kubeReserved.memory: invalid quantity "lots"'),
        ({"cluster_dns": ("10.0.0.300",)}, "clusterDNS[0]: invalid IP address '10.0.0.300'"),
        (
            {"static_pod_url": "ftp://x/pods"},
            "staticPodURL: must be an http:// or https:// URL, got 'ftp://x/pods'",
        ),
        ({"pod_logs_dir": "logs"}, "podLogsDir: must be an absolute path, got 'logs'"),
        (
            {"tls_cert_file": "/a.crt"},
            "tlsPrivateKeyFile: tlsCertFile and tlsPrivateKeyFile must be set together",
        ),
        (
            {"max_parallel_image_pulls": 3},
            "maxParallelImagePulls: cannot be above 1 when serializeImagePulls is true",
        ),
        ({"container_log_max_files": 1}, "containerLogMaxFiles: must be at least 2, got 1"),
        (
            {"enforce_node_allocatable": ("none", "pods")},
            'enforceNodeAllocatable: "none" cannot be combined with other options',
        ),
        (
            {"register_with_taints": ({"key": "a", "effect": "Sometimes"},)},
            "registerWithTaints[0].effect: "
            "must be one of NoExecute, NoSchedule, PreferNoSchedule; got 'Sometimes'",
        ),
    ],
)
def test_validate(changes: dict[str, Any], problem: str) -> None:
    cfg = dataclasses.replace(KubeletConfiguration(), **changes)
    assert validate(cfg) == [problem]


def test_validate_reserved_enforcement_needs_its_cgroup() -> None:
    cfg = dataclasses.replace(KubeletConfiguration(), enforce_node_allocatable=("system-reserved",))
    assert validate(cfg) == [
        "systemReservedCgroup: required when enforceNodeAllocatable has system-reserved",
    ]
    cfg = dataclasses.replace(cfg, system_reserved_cgroup="/system.slice")
    assert validate(cfg) == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {
                "enforce_node_allocatable": ("system-reserved",),
                "system_reserved": {"hugepages-2Mi": "4Mi", "memory": "1Gi"},
            },
            "systemReserved.hugepages-2Mi: with enforceNodeAllocatable system-reserved: "
            "not implemented by klet: hugetlb limits on a reserved cgroup",
        ),
    ],
)
def test_validate_refuses_what_reserved_enforcement_does_not_do(
    changes: dict[str, Any], problem: str
) -> None:
    cfg = dataclasses.replace(
        KubeletConfiguration(),
        system_reserved_cgroup="/system.slice",
        kube_reserved_cgroup="/kube",
        **changes,
    )
    assert validate(cfg) == [problem]


def test_validate_compressible_enforcement_takes_reserved_huge_pages() -> None:
    """Only CPU is written with the -compressible keys: reserved huge pages are fine."""
    cfg = dataclasses.replace(
        KubeletConfiguration(),
        enforce_node_allocatable=("pods", "system-reserved-compressible"),
        system_reserved_cgroup="/system.slice",
        system_reserved={"hugepages-2Mi": "4Mi"},
    )
    assert validate(cfg) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"eviction_hard": {"memory.available": "0%", "pid.available": "5%"}},
        {
            "eviction_soft": {"memory.available": "1Gi"},
            "eviction_soft_grace_period": {"memory.available": 30.0},
        },
        {"container_runtime_endpoint": "tcp://127.0.0.1:1234"},
        {"address": "::"},
        {"image_gc_low_threshold_percent": 0, "image_gc_high_threshold_percent": 100},
    ],
)
def test_validate_accepts(changes: dict[str, Any]) -> None:
    assert validate(dataclasses.replace(KubeletConfiguration(), **changes)) == []


def test_to_upstream_round_trips(tmp_path: Path) -> None:
    cfg = load_config_file(
        write(
            tmp_path,
            "syncFrequency: 90s\nevictionSoft: {memory.available: 1Gi}\n"
            "evictionSoftGracePeriod: {memory.available: 30s}\nclusterDNS: [10.0.0.10]\n",
        )
    )
    upstream = cfg.to_upstream()
    assert upstream["syncFrequency"] == "1m30s"
    assert upstream["cpuCFSQuotaPeriod"] == "100ms"
    assert upstream["authentication"]["webhook"]["cacheTTL"] == "2m0s"
    assert "tracing" not in upstream and "maxParallelImagePulls" not in upstream
    json.dumps(upstream)  # serializable as /configz
    decoded, problems = decode_config(upstream)
    assert problems == []
    assert decoded == cfg


def test_decoding_tells_which_fields_the_file_set() -> None:
    given: set[str] = set()
    _, problems = decode_config(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "logging": {"format": "text"},  # the default, but set
            "authentication": {"webhook": {"cacheTTL": "1m"}},
            "maxPods": "many",  # not decoded: not given
            "address": "",  # a zero that means "not set" upstream
        },
        given=given,
    )
    assert len(problems) == 1
    assert given == {
        "logging",
        "logging.format",
        "authentication",
        "authentication.webhook",
        "authentication.webhook.cacheTTL",
    }

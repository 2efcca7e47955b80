"""KubeletConfiguration: the upstream `kubelet.config.k8s.io/v1beta1` file, as frozen dataclasses.

Every upstream field is here, so a file written for the upstream kubelet loads unchanged
(strict decoding refuses unknown fields, so the ones klet ignores must still be known).
Attributes are snake_case; each field's metadata carries its upstream camelCase name and
value kind, which drive decoding (decoding.py), validation messages and `to_upstream()`
(the /configz form). Defaults are those of upstream's SetDefaults_KubeletConfiguration
(release 1.34); fields upstream keeps as pointers with no default are `None`.

Units: durations are float seconds, percentages are ints 0..100, quantity maps keep their
strings ("100Mi", "10%") because a threshold may be either a quantity or a percentage and
only its consumer knows the capacity to apply a percentage to (see units.py).

Trade-off: maps and lists are plain dicts and tuples inside a frozen dataclass; treat
them as read-only (use `dataclasses.replace` to derive a changed configuration).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from klet.model.units import format_duration

__all__ = [
    "API_VERSION",
    "DEFAULT_EVICTION_HARD",
    "KIND",
    "CrashLoopBackOffConfig",
    "KubeletAnonymousAuthentication",
    "KubeletAuthentication",
    "KubeletAuthorization",
    "KubeletConfiguration",
    "KubeletWebhookAuthentication",
    "KubeletWebhookAuthorization",
    "KubeletX509Authentication",
    "LoggingConfiguration",
    "MemorySwapConfiguration",
    "TracingConfiguration",
    "UserNamespaces",
    "upstream_name",
]

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"

# Linux hard-eviction defaults (upstream defaults_linux.go), applied when the file has no
# evictionHard at all; `evictionHard: {}` disables them, as upstream.
DEFAULT_EVICTION_HARD: Mapping[str, str] = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "nodefs.inodesFree": "5%",
    "imagefs.available": "15%",
}

Kind = Literal[
    "str",
    "int32",
    "int64",
    "float",
    "bool",
    "duration",  # Go duration string -> float seconds
    "duration_or_ns",  # logging.flushFrequency: a duration string or integer nanoseconds
    "str_list",  # -> tuple[str, ...]
    "str_map",  # map[string]string
    "bool_map",  # map[string]bool (featureGates)
    "str_list_map",  # map[string][]string (staticPodURLHeader)
    "duration_map",  # map[string]<duration> -> float seconds
    "object_list",  # list of objects kept as decoded JSON (taints, reservedMemory, ...)
    "object",  # an object kept as decoded JSON (logging.options)
    "nested",  # one of the dataclasses below
]


def _f(
    json_name: str,
    kind: Kind,
    default: Any = None,
    *,
    factory: Callable[[], Any] | None = None,
    zero_unset: bool = False,
    path_ref: bool = False,
    cls: type[Any] | None = None,
) -> Any:
    """Declare a field: its upstream name, its kind and its default.

    zero_unset: upstream's field is a plain value whose zero means "not set" (the default
    replaces an explicit 0/""/"0s" from the file); pointer fields keep an explicit zero.
    path_ref: a relative path in the file resolves against the file's directory.
    cls: the dataclass of a `nested` field (defaults to `factory`).
    """
    meta: dict[str, Any] = {
        "json": json_name,
        "kind": kind,
        "zero_unset": zero_unset,
        "path_ref": path_ref,
        "cls": cls if cls is not None else factory,
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class KubeletX509Authentication:
    """Client-certificate authentication of the kubelet API."""

    client_ca_file: str = _f("clientCAFile", "str", "", path_ref=True)  # "" = no client certs


@dataclasses.dataclass(frozen=True)
class KubeletWebhookAuthentication:
    """Bearer-token authentication through TokenReview."""

    enabled: bool = _f("enabled", "bool", True)
    cache_ttl: float = _f("cacheTTL", "duration", 120.0, zero_unset=True)  # seconds, default 2m


@dataclasses.dataclass(frozen=True)
class KubeletAnonymousAuthentication:
    """Whether requests no authenticator accepted pass as system:anonymous."""

    enabled: bool = _f("enabled", "bool", False)


@dataclasses.dataclass(frozen=True)
class KubeletAuthentication:
    """How requests to the kubelet API (port 10250) are authenticated."""

    x509: KubeletX509Authentication = _f("x509", "nested", factory=KubeletX509Authentication)
    webhook: KubeletWebhookAuthentication = _f(
        "webhook", "nested", factory=KubeletWebhookAuthentication
    )
    anonymous: KubeletAnonymousAuthentication = _f(
        "anonymous", "nested", factory=KubeletAnonymousAuthentication
    )


@dataclasses.dataclass(frozen=True)
class KubeletWebhookAuthorization:
    """Caching of SubjectAccessReview answers."""

    cache_authorized_ttl: float = _f("cacheAuthorizedTTL", "duration", 300.0, zero_unset=True)
    cache_unauthorized_ttl: float = _f("cacheUnauthorizedTTL", "duration", 30.0, zero_unset=True)


@dataclasses.dataclass(frozen=True)
class KubeletAuthorization:
    """How requests to the kubelet API are authorized: "Webhook" (default) or "AlwaysAllow"."""

    mode: str = _f("mode", "str", "Webhook", zero_unset=True)
    webhook: KubeletWebhookAuthorization = _f(
        "webhook", "nested", factory=KubeletWebhookAuthorization
    )


@dataclasses.dataclass(frozen=True)
class LoggingConfiguration:
    """Upstream's logging block. `format` ("text", klog's form, or "json") is also set
    by --logging-format; klet takes `verbosity` from it when -v is absent (settings.py)."""

    format: str = _f("format", "str", "text", zero_unset=True)
    flush_frequency: float = _f("flushFrequency", "duration_or_ns", 5.0, zero_unset=True)  # s
    verbosity: int = _f("verbosity", "int32", 0)
    vmodule: tuple[Mapping[str, Any], ...] = _f("vmodule", "object_list", ())
    options: Mapping[str, Any] = _f("options", "object", factory=dict)


@dataclasses.dataclass(frozen=True)
class MemorySwapConfiguration:
    """Swap available to workloads: "" / "NoSwap" (default) or "LimitedSwap"."""

    swap_behavior: str = _f("swapBehavior", "str", "")


@dataclasses.dataclass(frozen=True)
class CrashLoopBackOffConfig:
    """Container restart back-off."""

    # Cap of the restart back-off, seconds (1..300). Upstream leaves it unset and uses its
    # internal maximum of 300s; klet states that value.
    max_container_restart_period: float = _f("maxContainerRestartPeriod", "duration", 300.0)


@dataclasses.dataclass(frozen=True)
class TracingConfiguration:
    """OpenTelemetry tracing (accepted for compatibility; klet does not trace yet)."""

    endpoint: str = _f("endpoint", "str", "")
    sampling_rate_per_million: int | None = _f("samplingRatePerMillion", "int32", None)


@dataclasses.dataclass(frozen=True)
class UserNamespaces:
    """User-namespace ID mapping length per pod (None: runtime default, 65536)."""

    ids_per_pod: int | None = _f("idsPerPod", "int64", None)


def _default_eviction_hard() -> dict[str, str]:
    return dict(DEFAULT_EVICTION_HARD)


@dataclasses.dataclass(frozen=True)
class KubeletConfiguration:
    """The kubelet configuration file (`kubelet.config.k8s.io/v1beta1`, kind KubeletConfiguration).

    Durations in float seconds; ports, counts and percentages as ints; see the module
    docstring. Comments give the upstream default where it is not obvious.
    """

    # --- serving ---------------------------------------------------------------------
    enable_server: bool = _f("enableServer", "bool", True)
    address: str = _f("address", "str", "0.0.0.0", zero_unset=True)
    port: int = _f("port", "int32", 10250, zero_unset=True)  # 1..65535
    read_only_port: int = _f("readOnlyPort", "int32", 0)  # 0 = disabled
    healthz_port: int = _f("healthzPort", "int32", 10248)  # 0 = disabled
    healthz_bind_address: str = _f("healthzBindAddress", "str", "127.0.0.1", zero_unset=True)
    tls_cert_file: str = _f("tlsCertFile", "str", "", path_ref=True)
    tls_private_key_file: str = _f("tlsPrivateKeyFile", "str", "", path_ref=True)
    tls_cipher_suites: tuple[str, ...] = _f("tlsCipherSuites", "str_list", ())
    tls_min_version: str = _f("tlsMinVersion", "str", "")
    rotate_certificates: bool = _f("rotateCertificates", "bool", False)
    server_tls_bootstrap: bool = _f("serverTLSBootstrap", "bool", False)
    authentication: KubeletAuthentication = _f(
        "authentication", "nested", factory=KubeletAuthentication
    )
    authorization: KubeletAuthorization = _f(
        "authorization", "nested", factory=KubeletAuthorization
    )
    enable_debugging_handlers: bool = _f("enableDebuggingHandlers", "bool", True)
    enable_contention_profiling: bool = _f("enableContentionProfiling", "bool", False)
    enable_system_log_handler: bool = _f("enableSystemLogHandler", "bool", True)
    enable_system_log_query: bool = _f("enableSystemLogQuery", "bool", False)
    enable_profiling_handler: bool = _f("enableProfilingHandler", "bool", True)
    enable_debug_flags_handler: bool = _f("enableDebugFlagsHandler", "bool", True)
    streaming_connection_idle_timeout: float = _f(
        "streamingConnectionIdleTimeout", "duration", 4 * 3600.0, zero_unset=True
    )

    # --- pod sources -------------------------------------------------------------------
    static_pod_path: str = _f("staticPodPath", "str", "", path_ref=True)  # "" = none
    static_pod_url: str = _f("staticPodURL", "str", "")  # "" = none
    static_pod_url_header: Mapping[str, tuple[str, ...]] = _f(
        "staticPodURLHeader", "str_list_map", factory=dict
    )
    file_check_frequency: float = _f("fileCheckFrequency", "duration", 20.0, zero_unset=True)
    http_check_frequency: float = _f("httpCheckFrequency", "duration", 20.0, zero_unset=True)
    sync_frequency: float = _f("syncFrequency", "duration", 60.0, zero_unset=True)
    # klet extension (not in upstream's schema): period of the pod housekeeping pass that
    # upstream hard-codes to 2s. Seconds.
    pod_housekeeping_period: float = _f("podHousekeepingPeriod", "duration", 2.0, zero_unset=True)

    # --- runtime -------------------------------------------------------------------------
    container_runtime_endpoint: str = _f(
        "containerRuntimeEndpoint",
        "str",
        "unix:///run/containerd/containerd.sock",
        zero_unset=True,
    )
    image_service_endpoint: str = _f("imageServiceEndpoint", "str", "")  # "" = runtime's
    runtime_request_timeout: float = _f("runtimeRequestTimeout", "duration", 120.0, zero_unset=True)
    pod_logs_dir: str = _f("podLogsDir", "str", "/var/log/pods", zero_unset=True, path_ref=True)
    container_log_max_size: str = _f("containerLogMaxSize", "str", "10Mi", zero_unset=True)
    container_log_max_files: int = _f("containerLogMaxFiles", "int32", 5)
    container_log_max_workers: int = _f("containerLogMaxWorkers", "int32", 1)
    container_log_monitor_interval: float = _f("containerLogMonitorInterval", "duration", 10.0)
    serialize_image_pulls: bool = _f("serializeImagePulls", "bool", True)
    max_parallel_image_pulls: int | None = _f("maxParallelImagePulls", "int32", None)  # None=∞
    registry_pull_qps: int = _f("registryPullQPS", "int32", 5)  # 0 = unlimited
    registry_burst: int = _f("registryBurst", "int32", 10, zero_unset=True)
    image_pull_credentials_verification_policy: str = _f(
        "imagePullCredentialsVerificationPolicy", "str", ""
    )
    preloaded_images_verification_allowlist: tuple[str, ...] = _f(
        "preloadedImagesVerificationAllowlist", "str_list", ()
    )
    image_minimum_gc_age: float = _f("imageMinimumGCAge", "duration", 120.0, zero_unset=True)
    image_maximum_gc_age: float = _f("imageMaximumGCAge", "duration", 0.0)  # 0 = disabled
    image_gc_high_threshold_percent: int = _f("imageGCHighThresholdPercent", "int32", 85)
    image_gc_low_threshold_percent: int = _f("imageGCLowThresholdPercent", "int32", 80)
    crash_loop_back_off: CrashLoopBackOffConfig = _f(
        "crashLoopBackOff", "nested", factory=CrashLoopBackOffConfig
    )
    seccomp_default: bool = _f("seccompDefault", "bool", False)
    user_namespaces: UserNamespaces = _f("userNamespaces", "nested", factory=UserNamespaces)

    # --- pods, DNS -------------------------------------------------------------------------
    max_pods: int = _f("maxPods", "int32", 110, zero_unset=True)
    pods_per_core: int = _f("podsPerCore", "int32", 0)  # 0 = no per-core limit
    pod_pids_limit: int = _f("podPidsLimit", "int64", -1)  # -1 = node allocatable limit
    pod_cidr: str = _f("podCIDR", "str", "")
    cluster_domain: str = _f("clusterDomain", "str", "")
    cluster_dns: tuple[str, ...] = _f("clusterDNS", "str_list", ())
    resolv_conf: str = _f("resolvConf", "str", "/etc/resolv.conf", path_ref=True)  # "" = no DNS
    hairpin_mode: str = _f("hairpinMode", "str", "promiscuous-bridge", zero_unset=True)
    allowed_unsafe_sysctls: tuple[str, ...] = _f("allowedUnsafeSysctls", "str_list", ())
    run_once: bool = _f("runOnce", "bool", False)
    shutdown_grace_period: float = _f("shutdownGracePeriod", "duration", 0.0)
    shutdown_grace_period_critical_pods: float = _f(
        "shutdownGracePeriodCriticalPods", "duration", 0.0
    )
    shutdown_grace_period_by_pod_priority: tuple[Mapping[str, Any], ...] = _f(
        "shutdownGracePeriodByPodPriority", "object_list", ()
    )

    # --- cgroups and resources -------------------------------------------------------------
    cgroups_per_qos: bool = _f("cgroupsPerQOS", "bool", True)
    cgroup_driver: str = _f("cgroupDriver", "str", "cgroupfs", zero_unset=True)
    cgroup_root: str = _f("cgroupRoot", "str", "")
    kubelet_cgroups: str = _f("kubeletCgroups", "str", "")
    system_cgroups: str = _f("systemCgroups", "str", "")
    cpu_cfs_quota: bool = _f("cpuCFSQuota", "bool", True)
    cpu_cfs_quota_period: float = _f("cpuCFSQuotaPeriod", "duration", 0.1)  # 1ms..1s
    cpu_manager_policy: str = _f("cpuManagerPolicy", "str", "none", zero_unset=True)
    cpu_manager_policy_options: Mapping[str, str] = _f(
        "cpuManagerPolicyOptions", "str_map", factory=dict
    )
    cpu_manager_reconcile_period: float = _f(
        "cpuManagerReconcilePeriod", "duration", 10.0, zero_unset=True
    )
    memory_manager_policy: str = _f("memoryManagerPolicy", "str", "None", zero_unset=True)
    topology_manager_policy: str = _f("topologyManagerPolicy", "str", "none", zero_unset=True)
    topology_manager_scope: str = _f("topologyManagerScope", "str", "container", zero_unset=True)
    topology_manager_policy_options: Mapping[str, str] = _f(
        "topologyManagerPolicyOptions", "str_map", factory=dict
    )
    qos_reserved: Mapping[str, str] = _f("qosReserved", "str_map", factory=dict)
    single_process_oom_kill: bool | None = _f("singleProcessOOMKill", "bool", None)
    memory_throttling_factor: float = _f("memoryThrottlingFactor", "float", 0.9)
    memory_swap: MemorySwapConfiguration = _f(
        "memorySwap", "nested", factory=MemorySwapConfiguration
    )
    fail_swap_on: bool = _f("failSwapOn", "bool", True)
    fail_cgroup_v1: bool = _f("failCgroupV1", "bool", False)
    kube_reserved: Mapping[str, str] = _f("kubeReserved", "str_map", factory=dict)
    system_reserved: Mapping[str, str] = _f("systemReserved", "str_map", factory=dict)
    kube_reserved_cgroup: str = _f("kubeReservedCgroup", "str", "")
    system_reserved_cgroup: str = _f("systemReservedCgroup", "str", "")
    reserved_system_cpus: str = _f("reservedSystemCPUs", "str", "")
    reserved_memory: tuple[Mapping[str, Any], ...] = _f("reservedMemory", "object_list", ())
    enforce_node_allocatable: tuple[str, ...] = _f("enforceNodeAllocatable", "str_list", ("pods",))
    protect_kernel_defaults: bool = _f("protectKernelDefaults", "bool", False)
    make_iptables_util_chains: bool = _f("makeIPTablesUtilChains", "bool", True)
    iptables_masquerade_bit: int = _f("iptablesMasqueradeBit", "int32", 14)
    iptables_drop_bit: int = _f("iptablesDropBit", "int32", 15)
    max_open_files: int = _f("maxOpenFiles", "int64", 1_000_000, zero_unset=True)
    oom_score_adj: int = _f("oomScoreAdj", "int32", -999)
    local_storage_capacity_isolation: bool = _f("localStorageCapacityIsolation", "bool", True)
    volume_stats_agg_period: float = _f("volumeStatsAggPeriod", "duration", 60.0, zero_unset=True)
    volume_plugin_dir: str = _f(
        "volumePluginDir",
        "str",
        "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/",
        zero_unset=True,
    )
    enable_controller_attach_detach: bool = _f("enableControllerAttachDetach", "bool", True)
    kernel_memcg_notification: bool = _f("kernelMemcgNotification", "bool", False)

    # --- eviction ----------------------------------------------------------------------------
    # Signal -> threshold ("100Mi" quantity or "10%"); see DEFAULT_EVICTION_HARD.
    eviction_hard: Mapping[str, str] = _f("evictionHard", "str_map", factory=_default_eviction_hard)
    eviction_soft: Mapping[str, str] = _f("evictionSoft", "str_map", factory=dict)
    eviction_soft_grace_period: Mapping[str, float] = _f(  # signal -> seconds
        "evictionSoftGracePeriod", "duration_map", factory=dict
    )
    eviction_pressure_transition_period: float = _f(
        "evictionPressureTransitionPeriod", "duration", 300.0, zero_unset=True
    )
    eviction_max_pod_grace_period: int = _f("evictionMaxPodGracePeriod", "int32", 0)  # seconds
    eviction_minimum_reclaim: Mapping[str, str] = _f(
        "evictionMinimumReclaim", "str_map", factory=dict
    )
    merge_default_eviction_settings: bool = _f("mergeDefaultEvictionSettings", "bool", False)

    # --- node registration and status ---------------------------------------------------------
    register_node: bool = _f("registerNode", "bool", True)
    register_with_taints: tuple[Mapping[str, Any], ...] = _f(
        "registerWithTaints", "object_list", ()
    )
    provider_id: str = _f("providerID", "str", "")
    node_status_update_frequency: float = _f(
        "nodeStatusUpdateFrequency", "duration", 10.0, zero_unset=True
    )
    # Upstream: 5m, or nodeStatusUpdateFrequency when only that one is set in the file.
    node_status_report_frequency: float = _f(
        "nodeStatusReportFrequency", "duration", 300.0, zero_unset=True
    )
    node_lease_duration_seconds: int = _f("nodeLeaseDurationSeconds", "int32", 40, zero_unset=True)
    node_status_max_images: int = _f("nodeStatusMaxImages", "int32", 50)  # -1 = no cap
    event_record_qps: int = _f("eventRecordQPS", "int32", 50)  # 0 = unlimited
    event_burst: int = _f("eventBurst", "int32", 100, zero_unset=True)
    kube_api_qps: int = _f("kubeAPIQPS", "int32", 50)
    kube_api_burst: int = _f("kubeAPIBurst", "int32", 100, zero_unset=True)
    content_type: str = _f(
        "contentType", "str", "application/vnd.kubernetes.protobuf", zero_unset=True
    )
    config_map_and_secret_change_detection_strategy: str = _f(
        "configMapAndSecretChangeDetectionStrategy", "str", "Watch", zero_unset=True
    )

    # --- misc -----------------------------------------------------------------------------------
    feature_gates: Mapping[str, bool] = _f("featureGates", "bool_map", factory=dict)
    logging: LoggingConfiguration = _f("logging", "nested", factory=LoggingConfiguration)
    tracing: TracingConfiguration | None = _f("tracing", "nested", None, cls=TracingConfiguration)
    show_hidden_metrics_for_version: str = _f("showHiddenMetricsForVersion", "str", "")

    @property
    def effective_image_service_endpoint(self) -> str:
        """The image service endpoint; upstream falls back to the runtime endpoint."""
        return self.image_service_endpoint or self.container_runtime_endpoint

    def to_upstream(self) -> dict[str, Any]:
        """The upstream JSON form (camelCase, Go duration strings), as /configz serves it."""
        out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
        out.update(_encode_struct(self))
        return out


def nested_class(f: dataclasses.Field[Any]) -> type[Any]:
    """The dataclass of a `nested` field."""
    cls = f.metadata["cls"]
    if not isinstance(cls, type):  # pragma: no cover - a declaration error
        raise TypeError(f"nested field {f.name} declares no class")
    return cls


def upstream_name(path: str, cls: type[Any] = KubeletConfiguration) -> str:
    """Translate a dotted snake_case path to upstream's ("authentication.x509.client_ca_file"
    -> "authentication.x509.clientCAFile")."""
    parts: list[str] = []
    current: type[Any] | None = cls
    for name in path.split("."):
        by_name = {f.name: f for f in dataclasses.fields(current)} if current else {}
        f = by_name.get(name)
        if f is None:
            raise KeyError(f"{cls.__name__} has no field {path!r}")
        parts.append(f.metadata["json"])
        current = nested_class(f) if f.metadata["kind"] == "nested" else None
    return ".".join(parts)


def _encode_value(kind: str, value: Any) -> Any:
    if kind in ("duration", "duration_or_ns"):
        return format_duration(value)
    if kind == "duration_map":
        return {k: format_duration(v) for k, v in value.items()}
    if kind == "nested":
        return _encode_struct(value)
    if kind == "str_list_map":
        return {k: list(v) for k, v in value.items()}
    if kind in ("str_list", "object_list"):
        return [dict(v) if isinstance(v, Mapping) else v for v in value]
    if kind in ("str_map", "bool_map", "object"):
        return dict(value)
    return value


def _encode_struct(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        out[f.metadata["json"]] = _encode_value(f.metadata["kind"], value)
    return out

"""Command-line flags with the upstream kubelet's names, plus klet's own `--redis-url` family.

One table (`FLAGS`) says, for every flag, how its text becomes a value and where the value
goes: a KubeletConfiguration field (`--pod-manifest-path` -> staticPodPath), a KletSettings
field, or (klet-only flags) also an environment variable. argparse only splits the command
line: every flag is registered with `action="append"` and `default=SUPPRESS`, so

* an absent flag leaves no trace and cannot override the file (precedence: explicit flag >
  config file > default, as upstream);
* conversion happens afterwards, in `convert_flags`, which reports every bad value at once
  instead of argparse's exit on the first;
* repeated flags keep upstream's semantics: scalars take the last value; list and map flags
  accumulate across repeats and replace (not merge with) the file's value.

Value syntaxes follow upstream's pflag types: booleans as strconv.ParseBool, `k=v,k2=v2`
maps (--node-labels, --kube-reserved), `signal<quantity` maps (--eviction-hard) and
`Key:Value` multimaps (--manifest-url-header 'a:hello,b:again' --manifest-url-header 'b:x').
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from klet.config.errors import Problem
from klet.config.kubelet import KubeletConfiguration, upstream_name
from klet.model.layout import DEFAULT_SERVICE_PORTS
from klet.model.units import parse_duration, parse_quantity

__all__ = [
    "FLAGS",
    "FlagSpec",
    "add_kubelet_flags",
    "apply_to_config",
    "convert_flags",
    "normalize_argv",
    "parse_signal_thresholds",
]

Parser = Callable[[list[str]], Any]


# --- value syntaxes (each raises ValueError with a message that quotes the text) ---------


def _go_bool(text: str) -> bool:
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError(f'invalid boolean "{text}"')


def _int(bits: int, *, low: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f'invalid integer "{text}"') from None
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise ValueError(f"{value} is out of range for int{bits}")
        if low is not None and value < low:
            raise ValueError(f"must be at least {low}, got {value}")
        return value

    return parse


def _port(text: str) -> int:
    value = _int(32)(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"must be between 0 and 65535, got {value}")
    return value


def _last(convert: Callable[[str], Any]) -> Parser:
    return lambda values: convert(values[-1])


def _pairs(values: list[str], sep: str, what: str) -> list[tuple[str, str]]:
    out = []
    for value in values:
        for item in value.split(","):
            if not item.strip():
                continue
            key, found, val = item.partition(sep)
            if not found or not key.strip():
                raise ValueError(f'malformed pair "{item}", expected {what}')
            out.append((key.strip(), val.strip()))
    return out


def _string_map(values: list[str]) -> dict[str, str]:
    return dict(_pairs(values, "=", "key=value"))


def _langle_map(values: list[str]) -> dict[str, str]:
    return dict(_pairs(values, "<", "signal<value"))


def parse_signal_thresholds(values: list[str]) -> dict[str, str]:
    """`--eviction-hard`'s parser: "memory.available<1Gi,nodefs.available<10%" (each value
    may hold several, comma-separated) to {signal: value}; raises ValueError naming the
    malformed pair. The values are checked where they are used (klet.eviction)."""
    return _langle_map(values)


def _duration_map(values: list[str]) -> dict[str, float]:
    return {k: parse_duration(v) for k, v in _pairs(values, "=", "signal=duration")}


def _bool_map(values: list[str]) -> dict[str, bool]:
    return {k: _go_bool(v) for k, v in _pairs(values, "=", "Name=true|false")}


def _colon_multimap(values: list[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for key, val in _pairs(values, ":", "Key:Value"):
        out[key] = (*out.get(key, ()), val)
    return out


def _string_list(values: list[str]) -> tuple[str, ...]:
    return tuple(item for value in values for item in value.split(",") if item)


def _string(values: list[str]) -> str:
    return values[-1]


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _taints(values: list[str]) -> tuple[dict[str, str], ...]:
    """`--register-with-taints`: "<key>=<value>:<effect>" or "<key>:<effect>", comma-separated,
    as upstream's taint flag; each value of a repeated flag adds to the list."""
    out: list[dict[str, str]] = []
    for value in values:
        for item in value.split(","):
            if not item.strip():
                continue
            spec, found, effect = item.strip().rpartition(":")
            if not found or not spec or effect not in _TAINT_EFFECTS:
                raise ValueError(
                    f'invalid taint "{item}", expected <key>=<value>:<effect> with effect one '
                    f"of {', '.join(_TAINT_EFFECTS)}"
                )
            key, _, val = spec.partition("=")
            taint = {"key": key, "effect": effect}
            if val:
                taint["value"] = val
            out.append(taint)
    return tuple(out)


def _reserved_memory(values: list[str]) -> tuple[dict[str, Any], ...]:
    """`--reserved-memory`: "<numa node>:<type>=<quantity>[,<type>=<quantity>...]", several
    nodes separated by ";", as upstream's ReservedMemoryVar; each value of a repeated flag
    adds to the list. The entries are reservedMemory's ({numaNode, limits}); validation
    checks them as it checks the file's."""
    usage = "expected numaNodeID:type=quantity[,type=quantity...]"
    out: list[dict[str, Any]] = []
    for value in values:
        if not value:
            continue
        for reservation in value.split(";"):
            node_text, found, limits_text = reservation.partition(":")
            if not found or ":" in limits_text:
                raise ValueError(
                    f"the reserved memory has incorrect format, {usage}, got {reservation}"
                )
            try:
                node = int(node_text)
            except ValueError:
                raise ValueError(f"the NUMA node ID must be an integer, got {node_text}") from None
            limits: dict[str, str] = {}
            for item in limits_text.split(","):
                name, found, quantity = item.partition("=")
                if not found or "=" in quantity:
                    raise ValueError(f"the reserved limit must be type=quantity, got {item}")
                if name != "memory" and not name.startswith("hugepages-"):
                    raise ValueError(f"memory type conversion error, unknown type: {name!r}")
                try:
                    parse_quantity(quantity)
                except ValueError:
                    raise ValueError(f"{quantity!r} is not a quantity") from None
                limits[name] = quantity
            out.append({"numaNode": node, "limits": limits})
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """One flag: its name, its value syntax and where its value goes."""

    flag: str  # "--pod-manifest-path"
    help: str  # including the default, since argparse's default is SUPPRESS
    parse: Parser = _string  # every occurrence, in order -> value
    field: str | None = None  # KubeletConfiguration dotted snake_case path
    setting: str | None = None  # KletSettings attribute
    env: str | None = None  # KLET_* variable, klet-only flags only
    metavar: str = "VALUE"
    short: str | None = None  # "-v"
    optional_value: bool = False  # a Go bool flag: "--flag" alone means true
    # Still works, and the service warns at start: what to use instead ("use --x").
    deprecated: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


_BOOL = _last(_go_bool)


def _cfg(flag: str, field: str, parse: Parser, metavar: str, help: str) -> FlagSpec:
    return FlagSpec(
        flag,
        f"{help} (config: {upstream_name(field)})",
        parse,
        field=field,
        metavar=metavar,
        optional_value=parse is _BOOL,
    )


_DUR = _last(parse_duration)
_I32 = _last(_int(32))
_I64 = _last(_int(64))

# Upstream flags that are fields of the configuration file.
_CONFIG_FLAGS: tuple[FlagSpec, ...] = (
    _cfg(
        "--pod-manifest-path",
        "static_pod_path",
        _string,
        "PATH",
        "static pod manifest file or directory",
    ),
    _cfg("--manifest-url", "static_pod_url", _string, "URL", "URL of static pod manifests"),
    _cfg(
        "--manifest-url-header",
        "static_pod_url_header",
        _colon_multimap,
        "KEY:VALUE,...",
        "HTTP headers for --manifest-url; repeatable, values for one key accumulate",
    ),
    _cfg(
        "--file-check-frequency",
        "file_check_frequency",
        _DUR,
        "DURATION",
        "manifest dir poll period (default 20s)",
    ),
    _cfg(
        "--http-check-frequency",
        "http_check_frequency",
        _DUR,
        "DURATION",
        "manifest URL poll period (default 20s)",
    ),
    _cfg(
        "--sync-frequency",
        "sync_frequency",
        _DUR,
        "DURATION",
        "max period between pod syncs (default 1m0s)",
    ),
    _cfg(
        "--container-runtime-endpoint",
        "container_runtime_endpoint",
        _string,
        "URL",
        "CRI runtime endpoint (default unix:///run/containerd/containerd.sock)",
    ),
    _cfg(
        "--image-service-endpoint",
        "image_service_endpoint",
        _string,
        "URL",
        "CRI image endpoint (default: the runtime endpoint)",
    ),
    _cfg(
        "--runtime-request-timeout",
        "runtime_request_timeout",
        _DUR,
        "DURATION",
        "CRI call timeout (default 2m0s)",
    ),
    _cfg(
        "--pod-logs-dir",
        "pod_logs_dir",
        _string,
        "PATH",
        "klet-only: pod log root (default /var/log/pods)",
    ),
    _cfg("--address", "address", _string, "IP", "kubelet API bind address (default 0.0.0.0)"),
    _cfg("--port", "port", _I32, "PORT", "kubelet API port (default 10250)"),
    _cfg(
        "--read-only-port",
        "read_only_port",
        _I32,
        "PORT",
        "read-only API port, 0 disables (default 0)",
    ),
    _cfg(
        "--healthz-port", "healthz_port", _I32, "PORT", "healthz port, 0 disables (default 10248)"
    ),
    _cfg(
        "--healthz-bind-address",
        "healthz_bind_address",
        _string,
        "IP",
        "healthz address (default 127.0.0.1)",
    ),
    _cfg(
        "--tls-cert-file",
        "tls_cert_file",
        _string,
        "PATH",
        "serving certificate (default: self-signed)",
    ),
    _cfg("--tls-private-key-file", "tls_private_key_file", _string, "PATH", "serving key"),
    _cfg(
        "--client-ca-file",
        "authentication.x509.client_ca_file",
        _string,
        "PATH",
        "CA bundle for client certificates",
    ),
    _cfg("--max-pods", "max_pods", _I32, "N", "pods this node may run (default 110)"),
    _cfg(
        "--volume-stats-agg-period",
        "volume_stats_agg_period",
        _DUR,
        "DURATION",
        "how often each CSI volume's usage is measured (default 1m)",
    ),
    _cfg(
        "--pod-max-pids", "pod_pids_limit", _I64, "N", "PIDs per pod, -1 = node limit (default -1)"
    ),
    _cfg(
        "--register-node", "register_node", _BOOL, "BOOL", "register the Node object (default true)"
    ),
    _cfg("--provider-id", "provider_id", _string, "ID", "cloud provider ID of the node"),
    _cfg(
        "--node-status-update-frequency",
        "node_status_update_frequency",
        _DUR,
        "DURATION",
        "node status computation period (default 10s)",
    ),
    _cfg(
        "--node-status-max-images",
        "node_status_max_images",
        _I32,
        "N",
        "images in node status, -1 = all (default 50)",
    ),
    _cfg(
        "--cluster-dns", "cluster_dns", _string_list, "IP,...", "cluster DNS server IPs; repeatable"
    ),
    _cfg("--cluster-domain", "cluster_domain", _string, "DOMAIN", "cluster DNS domain"),
    _cfg(
        "--resolv-conf",
        "resolv_conf",
        _string,
        "PATH",
        "resolver file for pods (default /etc/resolv.conf)",
    ),
    _cfg(
        "--cgroup-driver",
        "cgroup_driver",
        _string,
        "DRIVER",
        "cgroupfs or systemd (default cgroupfs)",
    ),
    _cfg("--cgroup-root", "cgroup_root", _string, "PATH", "root cgroup for pods"),
    _cfg(
        "--cgroups-per-qos", "cgroups_per_qos", _BOOL, "BOOL", "QoS cgroup hierarchy (default true)"
    ),
    _cfg(
        "--fail-swap-on",
        "fail_swap_on",
        _BOOL,
        "BOOL",
        "refuse to start with swap on (default true; klet refuses swap either way)",
    ),
    _cfg(
        "--rotate-certificates",
        "rotate_certificates",
        _BOOL,
        "BOOL",
        "renew the client certificate through the certificates API as it nears expiry "
        "(default false)",
    ),
    _cfg(
        "--oom-score-adj",
        "oom_score_adj",
        _I32,
        "N",
        "oom_score_adj of each klet service process, -1000..1000 (default -999)",
    ),
    _cfg(
        "--serialize-image-pulls",
        "serialize_image_pulls",
        _BOOL,
        "BOOL",
        "pull one image at a time (default true)",
    ),
    _cfg(
        "--registry-qps",
        "registry_pull_qps",
        _I32,
        "N",
        "image pulls per second, 0 = no limit (default 5)",
    ),
    _cfg("--registry-burst", "registry_burst", _I32, "N", "image pull burst (default 10)"),
    _cfg(
        "--event-qps", "event_record_qps", _I32, "N", "events per second, 0 = no limit (default 50)"
    ),
    _cfg("--event-burst", "event_burst", _I32, "N", "event burst (default 100)"),
    _cfg("--kube-api-qps", "kube_api_qps", _I32, "N", "apiserver QPS (default 50)"),
    _cfg("--kube-api-burst", "kube_api_burst", _I32, "N", "apiserver burst (default 100)"),
    _cfg(
        "--image-gc-high-threshold",
        "image_gc_high_threshold_percent",
        _I32,
        "PERCENT",
        "disk use that always triggers image GC (default 85)",
    ),
    _cfg(
        "--image-gc-low-threshold",
        "image_gc_low_threshold_percent",
        _I32,
        "PERCENT",
        "disk use image GC frees down to (default 80)",
    ),
    _cfg(
        "--minimum-image-ttl-duration",
        "image_minimum_gc_age",
        _DUR,
        "DURATION",
        "minimum age of an unused image before GC (default 2m0s)",
    ),
    _cfg(
        "--eviction-hard",
        "eviction_hard",
        _langle_map,
        "SIGNAL<VALUE,...",
        "hard eviction thresholds, e.g. memory.available<1Gi; repeatable",
    ),
    _cfg(
        "--eviction-soft",
        "eviction_soft",
        _langle_map,
        "SIGNAL<VALUE,...",
        "soft eviction thresholds",
    ),
    _cfg(
        "--eviction-soft-grace-period",
        "eviction_soft_grace_period",
        _duration_map,
        "SIGNAL=DURATION,...",
        "grace periods of soft thresholds",
    ),
    _cfg(
        "--eviction-minimum-reclaim",
        "eviction_minimum_reclaim",
        _string_map,
        "SIGNAL=VALUE,...",
        "minimum reclaim per signal",
    ),
    _cfg(
        "--eviction-pressure-transition-period",
        "eviction_pressure_transition_period",
        _DUR,
        "DURATION",
        "pressure condition hold time (default 5m0s)",
    ),
    _cfg(
        "--eviction-max-pod-grace-period",
        "eviction_max_pod_grace_period",
        _I32,
        "SECONDS",
        "grace period cap for soft evictions, 0 = pod's own (default 0)",
    ),
    _cfg(
        "--kube-reserved",
        "kube_reserved",
        _string_map,
        "RESOURCE=QUANTITY,...",
        "resources for Kubernetes daemons",
    ),
    _cfg(
        "--system-reserved",
        "system_reserved",
        _string_map,
        "RESOURCE=QUANTITY,...",
        "resources for the OS",
    ),
    _cfg(
        "--enforce-node-allocatable",
        "enforce_node_allocatable",
        _string_list,
        "LIST",
        "node allocatable enforcement (default pods)",
    ),
    _cfg(
        "--system-reserved-cgroup",
        "system_reserved_cgroup",
        _string,
        "PATH",
        "existing cgroup for system-reserved enforcement",
    ),
    _cfg(
        "--kube-reserved-cgroup",
        "kube_reserved_cgroup",
        _string,
        "PATH",
        "existing cgroup for kube-reserved enforcement",
    ),
    _cfg(
        "--container-log-max-size",
        "container_log_max_size",
        _string,
        "QUANTITY",
        "log rotation size (default 10Mi)",
    ),
    _cfg(
        "--container-log-max-files",
        "container_log_max_files",
        _I32,
        "N",
        "rotated log files kept (default 5)",
    ),
    _cfg(
        "--max-open-files",
        "max_open_files",
        _I64,
        "N",
        "open files of the process (default 1000000)",
    ),
    _cfg("--feature-gates", "feature_gates", _bool_map, "NAME=BOOL,...", "feature gates"),
    _cfg(
        "--logging-format",
        "logging.format",
        _string,
        "FORMAT",
        "service log lines: text (klog's form) or json (default text)",
    ),
    # Upstream's other flags over configuration fields (issue 41): each sets its field, and
    # a value klet does not implement is refused by validation naming the flag.
    *(
        _cfg(flag, field, parse, metavar, help)
        for flag, field, parse, metavar, help in (
            (
                "--allowed-unsafe-sysctls",
                "allowed_unsafe_sysctls",
                _string_list,
                "LIST",
                "unsafe sysctls (or patterns ending in *) pods may set",
            ),
            (
                "--anonymous-auth",
                "authentication.anonymous.enabled",
                _BOOL,
                "BOOL",
                "anonymous requests to the kubelet API (default false)",
            ),
            (
                "--authentication-token-webhook",
                "authentication.webhook.enabled",
                _BOOL,
                "BOOL",
                "bearer tokens checked with TokenReview (default true)",
            ),
            (
                "--authentication-token-webhook-cache-ttl",
                "authentication.webhook.cache_ttl",
                _DUR,
                "DURATION",
                "TokenReview answer cache (default 2m0s)",
            ),
            (
                "--authorization-mode",
                "authorization.mode",
                _string,
                "MODE",
                "AlwaysAllow or Webhook (default Webhook)",
            ),
            (
                "--authorization-webhook-cache-authorized-ttl",
                "authorization.webhook.cache_authorized_ttl",
                _DUR,
                "DURATION",
                "allowed SubjectAccessReview cache (default 5m0s)",
            ),
            (
                "--authorization-webhook-cache-unauthorized-ttl",
                "authorization.webhook.cache_unauthorized_ttl",
                _DUR,
                "DURATION",
                "denied SubjectAccessReview cache (default 30s)",
            ),
            (
                "--contention-profiling",
                "enable_contention_profiling",
                _BOOL,
                "BOOL",
                "lock contention profiling (default false)",
            ),
            (
                "--cpu-cfs-quota",
                "cpu_cfs_quota",
                _BOOL,
                "BOOL",
                "CFS quota for CPU limits (default true)",
            ),
            (
                "--cpu-cfs-quota-period",
                "cpu_cfs_quota_period",
                _DUR,
                "DURATION",
                "CFS quota period (default 100ms)",
            ),
            (
                "--cpu-manager-policy",
                "cpu_manager_policy",
                _string,
                "POLICY",
                "CPU manager policy (default none)",
            ),
            (
                "--cpu-manager-policy-options",
                "cpu_manager_policy_options",
                _string_map,
                "KEY=VALUE,...",
                "CPU manager policy options",
            ),
            (
                "--cpu-manager-reconcile-period",
                "cpu_manager_reconcile_period",
                _DUR,
                "DURATION",
                "CPU manager reconcile period (default 10s)",
            ),
            (
                "--enable-controller-attach-detach",
                "enable_controller_attach_detach",
                _BOOL,
                "BOOL",
                "the attach/detach controller attaches this node's volumes (default true)",
            ),
            (
                "--enable-debugging-handlers",
                "enable_debugging_handlers",
                _BOOL,
                "BOOL",
                "logs, exec, attach and port-forward on the kubelet API (default true)",
            ),
            (
                "--enable-server",
                "enable_server",
                _BOOL,
                "BOOL",
                "the kubelet API server (default true)",
            ),
            (
                "--fail-cgroupv1",
                "fail_cgroup_v1",
                _BOOL,
                "BOOL",
                "refuse to start on a cgroup v1 host (default false)",
            ),
            (
                "--hairpin-mode",
                "hairpin_mode",
                _string,
                "MODE",
                "hairpin mode (default promiscuous-bridge)",
            ),
            (
                "--kernel-memcg-notification",
                "kernel_memcg_notification",
                _BOOL,
                "BOOL",
                "memcg threshold notifications for eviction (default false)",
            ),
            (
                "--kube-api-content-type",
                "content_type",
                _string,
                "TYPE",
                "content type of apiserver requests (default application/vnd.kubernetes.protobuf)",
            ),
            (
                "--kubelet-cgroups",
                "kubelet_cgroups",
                _string,
                "PATH",
                "cgroup of the kubelet's processes",
            ),
            (
                "--local-storage-capacity-isolation",
                "local_storage_capacity_isolation",
                _BOOL,
                "BOOL",
                "ephemeral-storage limits and evictions (default true)",
            ),
            (
                "--log-flush-frequency",
                "logging.flush_frequency",
                _DUR,
                "DURATION",
                "log flush period (default 5s)",
            ),
            (
                "--make-iptables-util-chains",
                "make_iptables_util_chains",
                _BOOL,
                "BOOL",
                "iptables utility chains (default true)",
            ),
            (
                "--memory-manager-policy",
                "memory_manager_policy",
                _string,
                "POLICY",
                "memory manager policy (default None)",
            ),
            ("--pod-cidr", "pod_cidr", _string, "CIDR", "pod CIDR of a standalone node"),
            (
                "--pods-per-core",
                "pods_per_core",
                _I32,
                "N",
                "pods per core, 0 = no per-core limit (default 0)",
            ),
            (
                "--protect-kernel-defaults",
                "protect_kernel_defaults",
                _BOOL,
                "BOOL",
                "fail when kernel tunables differ from the kubelet's defaults (default false)",
            ),
            (
                "--qos-reserved",
                "qos_reserved",
                _string_map,
                "RESOURCE=PERCENT,...",
                "resources reserved per QoS class",
            ),
            (
                "--register-with-taints",
                "register_with_taints",
                _taints,
                "KEY=VALUE:EFFECT,...",
                "taints the Node is registered with; repeatable",
            ),
            (
                "--reserved-memory",
                "reserved_memory",
                _reserved_memory,
                "NODE:TYPE=QUANTITY,...;...",
                "memory reserved per NUMA node for the Static memory manager; repeatable",
            ),
            (
                "--reserved-cpus",
                "reserved_system_cpus",
                _string,
                "CPUS",
                "CPUs reserved for the system and Kubernetes daemons",
            ),
            (
                "--rotate-server-certificates",
                "server_tls_bootstrap",
                _BOOL,
                "BOOL",
                "10250's serving certificate from the certificates API (default false)",
            ),
            (
                "--runonce",
                "run_once",
                _BOOL,
                "BOOL",
                "run the static pods once and exit (default false)",
            ),
            (
                "--seccomp-default",
                "seccomp_default",
                _BOOL,
                "BOOL",
                "RuntimeDefault seccomp for every container (default false)",
            ),
            (
                "--streaming-connection-idle-timeout",
                "streaming_connection_idle_timeout",
                _DUR,
                "DURATION",
                "idle exec/attach/port-forward timeout (default 4h0m0s)",
            ),
            (
                "--system-cgroups",
                "system_cgroups",
                _string,
                "PATH",
                "cgroup for non-kernel processes not in a container",
            ),
            (
                "--tls-cipher-suites",
                "tls_cipher_suites",
                _string_list,
                "LIST",
                "TLS cipher suites of the kubelet API (default: Python's)",
            ),
            (
                "--tls-min-version",
                "tls_min_version",
                _string,
                "VERSION",
                "minimum TLS version of the kubelet API",
            ),
            (
                "--topology-manager-policy",
                "topology_manager_policy",
                _string,
                "POLICY",
                "topology manager policy (default none)",
            ),
            (
                "--topology-manager-policy-options",
                "topology_manager_policy_options",
                _string_map,
                "KEY=VALUE,...",
                "topology manager policy options",
            ),
            (
                "--topology-manager-scope",
                "topology_manager_scope",
                _string,
                "SCOPE",
                "topology manager scope (default container)",
            ),
            (
                "--volume-plugin-dir",
                "volume_plugin_dir",
                _string,
                "PATH",
                "FlexVolume plugin directory",
            ),
        )
    ),
)

# Upstream flags that are not part of the file (KubeletFlags), and klet-only flags.
_SETTING_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec(
        "--config",
        "KubeletConfiguration file (YAML or JSON)",
        setting="config_file",
        metavar="PATH",
    ),
    FlagSpec(
        "--config-dir",
        "directory of KubeletConfiguration drop-ins (*.conf, subdirectories included), "
        "merged over --config in lexical order as JSON merge patches; flags still win",
        setting="config_dir",
        metavar="DIR",
    ),
    FlagSpec(
        "--kubeconfig",
        "kubeconfig of the apiserver; absent = standalone (static pods only)",
        setting="kubeconfig",
        metavar="PATH",
    ),
    FlagSpec(
        "--bootstrap-kubeconfig",
        "kubeconfig with bootstrap credentials (a bootstrap token): used to request a "
        "client certificate when --kubeconfig does not exist or its certificate has "
        "expired; --kubeconfig is then written to use it (from <cert-dir>)",
        setting="bootstrap_kubeconfig",
        metavar="PATH",
    ),
    FlagSpec(
        "--hostname-override",
        "node name instead of the hostname",
        setting="node_name",
        metavar="NAME",
    ),
    FlagSpec("--node-ip", "node IP, or an IPv4,IPv6 pair", setting="node_ip", metavar="IP[,IP]"),
    FlagSpec(
        "--node-labels",
        "labels to register the node with; repeatable",
        _string_map,
        setting="node_labels",
        metavar="KEY=VALUE,...",
    ),
    FlagSpec(
        "--cloud-provider",
        '"" (no cloud provider) or "external": the Node registers with the '
        "node.cloudprovider.kubernetes.io/uninitialized taint and leaves its addresses to "
        'the cloud controller manager (default "")',
        setting="cloud_provider",
        metavar="PROVIDER",
    ),
    FlagSpec(
        "--root-dir",
        "state directory (default /var/lib/kubelet)",
        setting="root_dir",
        metavar="PATH",
    ),
    FlagSpec(
        "--cert-dir",
        "TLS certificate directory (default /var/lib/kubelet/pki)",
        setting="cert_dir",
        metavar="PATH",
    ),
    FlagSpec(
        "--v",
        "log verbosity: 0-3 info, 4+ debug (default: logging.verbosity of the file, 0)",
        _last(_int(32, low=0)),
        setting="verbosity",
        metavar="N",
        short="-v",
    ),
    FlagSpec(
        "--redis-url",
        "klet-only: bus Redis URL: unix://, redis:// or rediss:// (TLS); a TCP URL needs "
        "credentials unless --allow-insecure-redis; no password in it, use "
        "--redis-password-file (default unix:///run/klet/redis/redis.sock)",
        setting="redis_url",
        env="KLET_REDIS_URL",
        metavar="URL",
    ),
    FlagSpec(
        "--redis-username",
        "klet-only: the bus Redis ACL user of this service, e.g. klet-syncloop@<node> "
        "(default: none, Redis's default user)",
        setting="redis_username",
        env="KLET_REDIS_USERNAME",
        metavar="USER",
    ),
    FlagSpec(
        "--redis-password-file",
        "klet-only: file whose first line is the bus Redis password, read at start (default: none)",
        setting="redis_password_file",
        env="KLET_REDIS_PASSWORD_FILE",
        metavar="PATH",
    ),
    FlagSpec(
        "--redis-ca-file",
        "klet-only: CA bundle to verify a rediss:// server with (default: the system's)",
        setting="redis_ca_file",
        env="KLET_REDIS_CA_FILE",
        metavar="PATH",
    ),
    FlagSpec(
        "--redis-cert-file",
        "klet-only: client certificate for a rediss:// server (with --redis-key-file)",
        setting="redis_cert_file",
        env="KLET_REDIS_CERT_FILE",
        metavar="PATH",
    ),
    FlagSpec(
        "--redis-key-file",
        "klet-only: private key of --redis-cert-file",
        setting="redis_key_file",
        env="KLET_REDIS_KEY_FILE",
        metavar="PATH",
    ),
    FlagSpec(
        "--allow-insecure-redis",
        "klet-only: accept a redis:// or rediss:// URL without credentials (anyone who "
        "reaches that port can run pods as root on the node) (default false)",
        _BOOL,
        setting="allow_insecure_redis",
        env="KLET_ALLOW_INSECURE_REDIS",
        metavar="BOOL",
        optional_value=True,
    ),
    FlagSpec(
        "--run-dir",
        "klet-only: unix sockets of internal gRPC and pid files (default /run/klet)",
        setting="run_dir",
        env="KLET_RUN_DIR",
        metavar="PATH",
    ),
    FlagSpec(
        "--service-port",
        "klet-only: this service's /healthz /readyz /metrics port; 0 = any free port "
        "(published under <run-dir>/ports/<service>/) (default: the service's own, "
        + ", ".join(f"{name} {port}" for name, port in DEFAULT_SERVICE_PORTS.items())
        + ")",
        _last(_port),
        setting="service_port",
        env="KLET_SERVICE_PORT",
        metavar="PORT",
    ),
    FlagSpec(
        "--service-port-file",
        "klet-only: a file this replica writes its service port to once it listens, for "
        "`klet healthcheck` (removed at start and at exit); not shared by replicas "
        "(default none)",
        setting="service_port_file",
        env="KLET_SERVICE_PORT_FILE",
        metavar="PATH",
    ),
    FlagSpec(
        "--service-bind-address",
        "klet-only: address of the service port (default 127.0.0.1)",
        setting="service_bind_address",
        env="KLET_SERVICE_BIND_ADDRESS",
        metavar="IP",
    ),
    FlagSpec(
        "--log-format",
        "klet-only, deprecated: --logging-format's earlier name; wins over the file's "
        "logging.format, not over --logging-format",
        setting="log_format",
        env="KLET_LOG_FORMAT",
        metavar="FORMAT",
        deprecated="use --logging-format or the configuration's logging.format",
    ),
    FlagSpec(
        "--tls-bootstrap-timeout",
        "klet-only: how long a service waits for the certificate it asked for with "
        "--bootstrap-kubeconfig to be approved and issued before it exits naming the "
        "request (default 15m)",
        _DUR,
        setting="tls_bootstrap_timeout",
        env="KLET_TLS_BOOTSTRAP_TIMEOUT",
        metavar="DURATION",
    ),
    FlagSpec(
        "--pod-history-max-entries",
        "klet-only: entries kept of each pod's history (klet why); the oldest go first "
        "(default 256)",
        _I32,
        setting="pod_history_max_entries",
        env="KLET_POD_HISTORY_MAX_ENTRIES",
        metavar="N",
    ),
    FlagSpec(
        "--pod-history-max-age",
        "klet-only: a pod's history is kept this long after its last entry, and after "
        "the pod is gone (default 24h)",
        _DUR,
        setting="pod_history_max_age",
        env="KLET_POD_HISTORY_MAX_AGE",
        metavar="DURATION",
    ),
    FlagSpec(
        "--pod-history-max-pods",
        "klet-only: pods whose history is kept; past it the pods whose last entry is "
        "oldest lose theirs first (default 1000)",
        _I32,
        setting="pod_history_max_pods",
        env="KLET_POD_HISTORY_MAX_PODS",
        metavar="N",
    ),
    FlagSpec(
        "--evented-pleg-relist-period",
        "klet-only: syncloop's safety-net relist period while runtime events drive PLEG "
        "(featureGates.EventedPLEG, on by default); without events it relists every 1s "
        "(default 20s)",
        _DUR,
        setting="evented_pleg_relist_period",
        env="KLET_EVENTED_PLEG_RELIST_PERIOD",
        metavar="DURATION",
    ),
    FlagSpec(
        "--pod-worker-backoff-period",
        "klet-only: a pod worker retries a sync that failed in the pod's status (a "
        "container that could not be created or started) this long after it, plus up to "
        "half again; upstream's fixed backOffPeriod (default 10s)",
        _DUR,
        setting="pod_worker_backoff_period",
        env="KLET_POD_WORKER_BACKOFF_PERIOD",
        metavar="DURATION",
    ),
    # Container GC policy: upstream's deprecated KubeletFlags (no config file fields).
    FlagSpec(
        "--minimum-container-ttl-duration",
        "minimum age of a dead container before it is garbage-collected (default 0s)",
        _DUR,
        setting="minimum_container_ttl_duration",
        metavar="DURATION",
    ),
    FlagSpec(
        "--maximum-dead-containers-per-container",
        "dead instances kept per container of a pod; negative = no limit (default 1)",
        _I32,
        setting="maximum_dead_containers_per_container",
        metavar="N",
    ),
    FlagSpec(
        "--maximum-dead-containers",
        "dead containers kept on the node in all; negative = no limit (default -1)",
        _I32,
        setting="maximum_dead_containers",
        metavar="N",
    ),
    # Credential provider plugins (KubeletFlags; klet.config.credentialproviders).
    FlagSpec(
        "--image-credential-provider-config",
        "credential provider plugin config file (JSON/YAML/YML) or a directory of such "
        "files (merged in lexical order); needs --image-credential-provider-bin-dir",
        setting="image_credential_provider_config",
        metavar="PATH",
    ),
    FlagSpec(
        "--image-credential-provider-bin-dir",
        "the directory holding the credential provider plugins' executables",
        setting="image_credential_provider_bin_dir",
        metavar="PATH",
    ),
)

FLAGS: tuple[FlagSpec, ...] = _SETTING_FLAGS + _CONFIG_FLAGS


def add_kubelet_flags(parser: argparse.ArgumentParser) -> None:
    """Register every flag of FLAGS on `parser` (values are converted by convert_flags)."""
    groups = {
        "agent": parser.add_argument_group("agent"),
        "config": parser.add_argument_group("kubelet configuration (override the --config file)"),
    }
    for spec in FLAGS:
        group = groups["config" if spec.field else "agent"]
        names = [spec.flag] + ([spec.short] if spec.short else [])
        is_bool = spec.optional_value
        group.add_argument(
            *names,
            dest=spec.dest,
            action="append",
            default=argparse.SUPPRESS,
            metavar=spec.metavar,
            nargs="?" if is_bool else None,
            const="true" if is_bool else None,
            help=spec.help
            + (f" [env {spec.env}]" if spec.env else "")
            + (f" (DEPRECATED: {spec.deprecated})" if spec.deprecated else ""),
        )


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Accept Go flag spellings argparse does not: `--pod_manifest_path` (pflag normalizes
    underscores to dashes). Everything after `--` is left alone."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def convert_flags(
    namespace: argparse.Namespace, specs: Sequence[FlagSpec] = FLAGS
) -> tuple[dict[str, Any], list[Problem]]:
    """Convert the flags present in `namespace` to values, keyed by flag name ("--port").

    Every bad value is reported as a Problem naming the flag.
    """
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for spec in specs:
        raw = getattr(namespace, spec.dest, None)
        if raw is None:
            continue
        # argparse drops the "--" of `--port=--` and leaves an empty list in its place;
        # pflag keeps "--" as the value, which then fails the flag's own syntax.
        texts = [v if isinstance(v, str) else "--" for v in raw]
        try:
            values[spec.flag] = spec.parse(texts)
        except ValueError as exc:
            problems.append(Problem(spec.flag, str(exc)))
    return values, problems


def _replace_path(obj: Any, path: Sequence[str], value: Any) -> Any:
    head, *rest = path
    if rest:
        value = _replace_path(getattr(obj, head), rest, value)
    return dataclasses.replace(obj, **{head: value})


def apply_to_config(
    cfg: KubeletConfiguration, values: Mapping[str, Any], specs: Sequence[FlagSpec] = FLAGS
) -> tuple[KubeletConfiguration, dict[str, str]]:
    """Apply converted flag values over `cfg` (flags win over the file; `--feature-gates`
    gate by gate, as upstream, keeping the file's other gates).

    Returns the new configuration and, for problem attribution, a map from each
    overridden upstream field path to the flag that set it.
    """
    overridden: dict[str, str] = {}
    for spec in specs:
        if spec.field is None or spec.flag not in values:
            continue
        value = values[spec.flag]
        if spec.field == "feature_gates":
            # As upstream: the flag's gates win gate by gate; the file's others stay.
            cfg = dataclasses.replace(cfg, feature_gates={**cfg.feature_gates, **value})
            for name in value:
                overridden[f"featureGates.{name}"] = spec.flag
            continue
        cfg = _replace_path(cfg, spec.field.split("."), value)
        overridden[upstream_name(spec.field)] = spec.flag
    return cfg, overridden

"""Value checks of a KubeletConfiguration, after the upstream ValidateKubeletConfiguration.

Decoding (decoding.py) proves the types; this module proves the values: port ranges,
percentages, durations that drive loops being positive, eviction thresholds parsing as
quantities or percentages over known signals, endpoints being unix:// or tcp:// URLs, and
the cross-field rules (imageGCLowThresholdPercent below imageGCHighThresholdPercent, a
soft eviction threshold having a grace period, ...). Every problem is returned, each
naming the upstream field path, so an operator fixes the whole file in one pass.

Fields klet does not implement (CPU manager, topology manager, certificate rotation, ...)
are checked against their enumerations like any other, then refused unless they hold a
value klet implements (support.py), so nothing is accepted and silently ignored; so are
feature gates klet does not know or does not act on (gates.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from klet.config.errors import Problem
from klet.config.gates import gate_problems
from klet.config.kubelet import KubeletConfiguration
from klet.config.support import unimplemented_problems
from klet.model.cpuset import CPUSetError, parse_cpus
from klet.model.units import parse_percentage, parse_quantity

__all__ = ["EVICTION_SIGNALS", "validate", "validate_problems"]

# Signals a threshold may name (upstream pkg/kubelet/eviction/api).
EVICTION_SIGNALS = frozenset(
    {
        "memory.available",
        "allocatableMemory.available",
        "nodefs.available",
        "nodefs.inodesFree",
        "imagefs.available",
        "imagefs.inodesFree",
        "containerfs.available",
        "containerfs.inodesFree",
        "pid.available",
    }
)
_ENFORCE_KEYS = frozenset(
    {
        "pods",
        "system-reserved",
        "kube-reserved",
        "system-reserved-compressible",
        "kube-reserved-compressible",
        "none",
    }
)
_TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})


class _Checks:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def int_range(self, path: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            self.add(path, f"must be between {low} and {high}, got {value}")

    def non_negative(self, path: str, value: float) -> None:
        if value < 0:
            self.add(path, f"must not be negative, got {value:g}")

    def positive_duration(self, path: str, seconds: float) -> None:
        if seconds <= 0:
            self.add(path, f"must be a positive duration, got {seconds:g}s")

    def one_of(self, path: str, value: str, allowed: Iterable[str]) -> None:
        options = sorted(allowed)
        if value not in options:
            self.add(path, f"must be one of {', '.join(options)}; got {value!r}")

    def ip(self, path: str, value: str) -> None:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            self.add(path, f"invalid IP address {value!r}")

    def endpoint(self, path: str, value: str) -> None:
        try:  # urlsplit and .port raise ValueError on "tcp://[::1" or a port past 65535
            parts = urlsplit(value)
            if parts.scheme == "unix" and parts.path and not parts.netloc:
                return
            if parts.scheme == "tcp" and parts.hostname and parts.port is not None:
                return
        except ValueError:
            pass
        self.add(path, f"must be a unix:///path or tcp://host:port URL, got {value!r}")

    def quantity(self, path: str, value: str, *, percent: bool = False) -> None:
        if percent and value.endswith("%"):
            try:
                share = parse_percentage(value)
            except ValueError as exc:
                self.add(path, str(exc))
                return
            if not 0 <= share <= 100:
                self.add(path, f"percentage must be between 0% and 100%, got {value!r}")
            return
        try:
            amount = parse_quantity(value)
        except ValueError as exc:
            self.add(path, str(exc))
            return
        if amount < 0:
            self.add(path, f"must not be negative, got {value!r}")

    def thresholds(self, field: str, values: Mapping[str, Any], *, quantities: bool) -> None:
        for signal, value in values.items():
            path = f"{field}.{signal}"
            if signal not in EVICTION_SIGNALS:
                self.add(path, "unsupported eviction signal")
            elif quantities:
                self.quantity(path, value, percent=True)


def _check_serving(c: _Checks, cfg: KubeletConfiguration) -> None:
    c.int_range("port", cfg.port, 1, 65535)
    c.int_range("readOnlyPort", cfg.read_only_port, 0, 65535)
    c.int_range("healthzPort", cfg.healthz_port, 0, 65535)
    c.ip("address", cfg.address)
    c.ip("healthzBindAddress", cfg.healthz_bind_address)
    if bool(cfg.tls_cert_file) != bool(cfg.tls_private_key_file):
        missing = "tlsPrivateKeyFile" if cfg.tls_cert_file else "tlsCertFile"
        c.add(missing, "tlsCertFile and tlsPrivateKeyFile must be set together")
    c.one_of("authorization.mode", cfg.authorization.mode, ("AlwaysAllow", "Webhook"))
    c.non_negative("authentication.webhook.cacheTTL", cfg.authentication.webhook.cache_ttl)
    webhook = cfg.authorization.webhook
    c.non_negative("authorization.webhook.cacheAuthorizedTTL", webhook.cache_authorized_ttl)
    c.non_negative("authorization.webhook.cacheUnauthorizedTTL", webhook.cache_unauthorized_ttl)
    c.one_of("logging.format", cfg.logging.format, ("text", "json"))
    c.non_negative("logging.verbosity", cfg.logging.verbosity)


def _check_sources(c: _Checks, cfg: KubeletConfiguration) -> None:
    for path, seconds in (
        ("syncFrequency", cfg.sync_frequency),
        ("fileCheckFrequency", cfg.file_check_frequency),
        ("httpCheckFrequency", cfg.http_check_frequency),
        ("podHousekeepingPeriod", cfg.pod_housekeeping_period),
        ("nodeStatusUpdateFrequency", cfg.node_status_update_frequency),
        ("nodeStatusReportFrequency", cfg.node_status_report_frequency),
        ("runtimeRequestTimeout", cfg.runtime_request_timeout),
    ):
        c.positive_duration(path, seconds)
    if cfg.static_pod_url:
        try:
            parts = urlsplit(cfg.static_pod_url)
            usable = parts.scheme in ("http", "https") and bool(parts.netloc)
        except ValueError:  # "http://[" and the like
            usable = False
        if not usable:
            c.add("staticPodURL", f"must be an http:// or https:// URL, got {cfg.static_pod_url!r}")
    for name in cfg.static_pod_url_header:
        if not name or any(ch in name for ch in " \t\r\n:"):
            c.add(f"staticPodURLHeader.{name}", "invalid HTTP header name")


def _check_runtime(c: _Checks, cfg: KubeletConfiguration) -> None:
    c.endpoint("containerRuntimeEndpoint", cfg.container_runtime_endpoint)
    if cfg.image_service_endpoint:
        c.endpoint("imageServiceEndpoint", cfg.image_service_endpoint)
    logs_dir = cfg.pod_logs_dir
    if not logs_dir.startswith("/"):
        c.add("podLogsDir", f"must be an absolute path, got {logs_dir!r}")
    elif posixpath.normpath(logs_dir) != logs_dir.rstrip("/") or logs_dir == "/":
        c.add("podLogsDir", f"must be a normalized path other than /, got {logs_dir!r}")
    c.quantity("containerLogMaxSize", cfg.container_log_max_size)
    if cfg.container_log_max_files < 2:
        c.add("containerLogMaxFiles", f"must be at least 2, got {cfg.container_log_max_files}")
    if cfg.container_log_max_workers < 1:
        c.add("containerLogMaxWorkers", "must be at least 1")
    if cfg.container_log_monitor_interval < 3:
        c.add("containerLogMonitorInterval", "must be at least 3s")
    parallel = cfg.max_parallel_image_pulls
    if parallel is not None:
        if parallel < 1:
            c.add("maxParallelImagePulls", f"must be at least 1, got {parallel}")
        elif parallel > 1 and cfg.serialize_image_pulls:
            c.add("maxParallelImagePulls", "cannot be above 1 when serializeImagePulls is true")
    for path, value in (
        ("registryPullQPS", cfg.registry_pull_qps),
        ("registryBurst", cfg.registry_burst),
        ("eventRecordQPS", cfg.event_record_qps),
        ("eventBurst", cfg.event_burst),
        ("kubeAPIQPS", cfg.kube_api_qps),
        ("kubeAPIBurst", cfg.kube_api_burst),
        ("maxPods", cfg.max_pods),
        ("podsPerCore", cfg.pods_per_core),
        ("maxOpenFiles", cfg.max_open_files),
        ("evictionMaxPodGracePeriod", cfg.eviction_max_pod_grace_period),
    ):
        c.non_negative(path, value)
    restart = cfg.crash_loop_back_off.max_container_restart_period
    if not 1 <= restart <= 300:
        c.add("crashLoopBackOff.maxContainerRestartPeriod", "must be between 1s and 300s")
    ids = cfg.user_namespaces.ids_per_pod
    if ids is not None and (ids <= 0 or ids % 65536 or ids >= 2**32):
        c.add("userNamespaces.idsPerPod", "must be a positive multiple of 65536 below 2^32")


def _check_image_gc(c: _Checks, cfg: KubeletConfiguration) -> None:
    high, low = cfg.image_gc_high_threshold_percent, cfg.image_gc_low_threshold_percent
    c.int_range("imageGCHighThresholdPercent", high, 0, 100)
    c.int_range("imageGCLowThresholdPercent", low, 0, 100)
    if low >= high:
        c.add(
            "imageGCLowThresholdPercent",
            f"must be less than imageGCHighThresholdPercent ({low} >= {high})",
        )
    c.non_negative("imageMinimumGCAge", cfg.image_minimum_gc_age)
    c.non_negative("imageMaximumGCAge", cfg.image_maximum_gc_age)
    if 0 < cfg.image_maximum_gc_age <= cfg.image_minimum_gc_age:
        c.add("imageMaximumGCAge", "must be greater than imageMinimumGCAge")


def _check_node(c: _Checks, cfg: KubeletConfiguration) -> None:
    if cfg.node_lease_duration_seconds <= 0:
        c.add("nodeLeaseDurationSeconds", "must be greater than 0")
    if cfg.node_status_max_images < -1:
        c.add("nodeStatusMaxImages", "must be -1 (no cap) or greater")
    c.int_range("oomScoreAdj", cfg.oom_score_adj, -1000, 1000)
    c.int_range("iptablesMasqueradeBit", cfg.iptables_masquerade_bit, 0, 31)
    c.int_range("iptablesDropBit", cfg.iptables_drop_bit, 0, 31)
    for i, server in enumerate(cfg.cluster_dns):
        c.ip(f"clusterDNS[{i}]", server)
    for i, taint in enumerate(cfg.register_with_taints):
        if not isinstance(taint.get("key"), str) or not taint.get("key"):
            c.add(f"registerWithTaints[{i}].key", "required")
        c.one_of(f"registerWithTaints[{i}].effect", str(taint.get("effect", "")), _TAINT_EFFECTS)
    c.one_of("hairpinMode", cfg.hairpin_mode, ("promiscuous-bridge", "hairpin-veth", "none"))
    c.one_of(
        "configMapAndSecretChangeDetectionStrategy",
        cfg.config_map_and_secret_change_detection_strategy,
        ("Get", "Cache", "Watch"),
    )
    c.non_negative("shutdownGracePeriod", cfg.shutdown_grace_period)
    c.non_negative("shutdownGracePeriodCriticalPods", cfg.shutdown_grace_period_critical_pods)
    if cfg.shutdown_grace_period_critical_pods > cfg.shutdown_grace_period:
        c.add("shutdownGracePeriodCriticalPods", "must not exceed shutdownGracePeriod")
    if cfg.shutdown_grace_period_by_pod_priority and (
        cfg.shutdown_grace_period or cfg.shutdown_grace_period_critical_pods
    ):
        c.add(
            "shutdownGracePeriodByPodPriority",
            "cannot be combined with shutdownGracePeriod or shutdownGracePeriodCriticalPods",
        )
    for i, period in enumerate(cfg.shutdown_grace_period_by_pod_priority):
        path = f"shutdownGracePeriodByPodPriority[{i}]"
        for key in sorted(set(period) - {"priority", "shutdownGracePeriodSeconds"}):
            c.add(f"{path}.{key}", "unknown field")
        for key in ("priority", "shutdownGracePeriodSeconds"):
            value = period.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool):
                c.add(f"{path}.{key}", f"must be an integer, not {value!r}")
            elif key == "shutdownGracePeriodSeconds" and value < 0:
                c.add(f"{path}.{key}", "must not be negative")


def _check_cgroups(c: _Checks, cfg: KubeletConfiguration) -> None:
    c.one_of("cgroupDriver", cfg.cgroup_driver, ("cgroupfs", "systemd"))
    if cfg.system_cgroups and not cfg.cgroup_root:
        c.add("systemCgroups", "requires cgroupRoot")
    if cfg.cgroup_root and not cfg.cgroup_root.startswith("/"):
        c.add("cgroupRoot", f"must be an absolute cgroup path, not {cfg.cgroup_root!r}")
    period = cfg.cpu_cfs_quota_period
    if not 0.001 <= period <= 1:
        c.add("cpuCFSQuotaPeriod", "must be between 1ms and 1s")
    c.one_of("cpuManagerPolicy", cfg.cpu_manager_policy, ("none", "static"))
    c.one_of("memoryManagerPolicy", cfg.memory_manager_policy, ("None", "Static"))
    c.one_of(
        "topologyManagerPolicy",
        cfg.topology_manager_policy,
        ("none", "best-effort", "restricted", "single-numa-node"),
    )
    c.one_of("topologyManagerScope", cfg.topology_manager_scope, ("container", "pod"))
    c.one_of(
        "memorySwap.swapBehavior", cfg.memory_swap.swap_behavior, ("", "NoSwap", "LimitedSwap")
    )
    if not 0 < cfg.memory_throttling_factor <= 1:
        c.add("memoryThrottlingFactor", "must be greater than 0 and at most 1")
    enforce = cfg.enforce_node_allocatable
    for i, key in enumerate(enforce):
        if key not in _ENFORCE_KEYS:
            c.add(f"enforceNodeAllocatable[{i}]", f"unknown option {key!r}")
    if "none" in enforce and len(enforce) > 1:
        c.add("enforceNodeAllocatable", '"none" cannot be combined with other options')
    enforcing = [k for k in enforce if k != "none"]
    if enforcing and not cfg.cgroups_per_qos:
        c.add("enforceNodeAllocatable", "requires cgroupsPerQOS to be true")
    if any(k.startswith("system-reserved") for k in enforce) and not cfg.system_reserved_cgroup:
        c.add("systemReservedCgroup", "required when enforceNodeAllocatable has system-reserved")
    if any(k.startswith("kube-reserved") for k in enforce) and not cfg.kube_reserved_cgroup:
        c.add("kubeReservedCgroup", "required when enforceNodeAllocatable has kube-reserved")
    _check_reserved_enforcement(c, cfg)
    if cfg.reserved_system_cpus and (cfg.system_reserved_cgroup or cfg.kube_reserved_cgroup):
        c.add(
            "reservedSystemCPUs", "cannot be used with systemReservedCgroup or kubeReservedCgroup"
        )
    _check_cpu_manager(c, cfg)
    _check_memory_and_topology(c, cfg)
    for field, reserved in (
        ("kubeReserved", cfg.kube_reserved),
        ("systemReserved", cfg.system_reserved),
    ):
        for resource, amount in reserved.items():
            c.quantity(f"{field}.{resource}", amount)


_CPU_OPTIONS = (
    "full-pcpus-only",
    "distribute-cpus-across-numa",
    "align-by-socket",
    "distribute-cpus-across-cores",
    "strict-cpu-reservation",
    "prefer-align-cpus-by-uncorecache",
)
_GO_BOOLS = ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False")


def _check_cpu_manager(c: _Checks, cfg: KubeletConfiguration) -> None:
    """reservedSystemCPUs parses; the static policy has CPUs to reserve (upstream's
    container manager refuses to start without); its options are upstream's names with
    Go booleans. Which options klet implements is klet.config.support's; whether the
    gates allow one, and whether reservedSystemCPUs are online, syncloop checks at start
    (klet.syncloop.cpumanager), where the topology is read."""
    try:
        reserved = parse_cpus(cfg.reserved_system_cpus)
    except CPUSetError as err:
        c.add("reservedSystemCPUs", str(err))
        reserved = frozenset()
    if cfg.cpu_manager_policy == "static" and not reserved:
        cpu = [r.get("cpu") for r in (cfg.kube_reserved, cfg.system_reserved) if r.get("cpu")]
        try:
            total = sum(parse_quantity(str(q)) for q in cpu)
        except ValueError:
            total = None  # the quantity's own check names it
        if total is not None and total <= 0:
            c.add(
                "cpuManagerPolicy",
                "static needs reserved CPUs: the static policy requires systemreserved.cpu + "
                "kubereserved.cpu to be greater than zero (or reservedSystemCPUs)",
            )
    for name, value in sorted(cfg.cpu_manager_policy_options.items()):
        if name not in _CPU_OPTIONS:
            c.add(
                f"cpuManagerPolicyOptions.{name}",
                f"unknown CPU Manager Policy option (one of {', '.join(_CPU_OPTIONS)})",
            )
        elif value not in _GO_BOOLS:
            c.add(f"cpuManagerPolicyOptions.{name}", f"must be true or false, not {value!r}")
    if cfg.cpu_manager_policy_options and cfg.cpu_manager_policy != "static":
        c.add(
            "cpuManagerPolicyOptions",
            "None policy: received unsupported options (only the static policy takes options)",
        )


_TOPOLOGY_OPTIONS = ("prefer-closest-numa-nodes", "max-allowable-numa-nodes")


def _memory_limit(name: str) -> bool:
    return name == "memory" or name.startswith("hugepages-")


def _check_memory_and_topology(c: _Checks, cfg: KubeletConfiguration) -> None:
    """reservedMemory as upstream's validateReservedMemoryConfiguration (memory and
    hugepages-<size> only, not zero, no duplicate per NUMA node), required by the Static
    memory manager policy (upstream's policy refuses to start without); the topology
    manager's options are upstream's two, under their gates. That reservedMemory adds up
    to Node Allocatable's reservation and names NUMA nodes the machine has, syncloop
    checks at start (klet.syncloop.memorymanager), where the machine is read."""
    seen: set[tuple[object, str]] = set()
    for i, entry in enumerate(cfg.reserved_memory):
        path = f"reservedMemory[{i}]"
        for key in sorted(set(entry) - {"numaNode", "limits"}):
            c.add(f"{path}.{key}", "unknown field")
        node = entry.get("numaNode", 0)
        if not isinstance(node, int) or isinstance(node, bool) or node < 0:
            c.add(f"{path}.numaNode", f"must be a NUMA node number, not {node!r}")
        limits = entry.get("limits") or {}
        if not isinstance(limits, Mapping):
            c.add(f"{path}.limits", "must be a map of resource name to quantity")
            continue
        for name, quantity in sorted(limits.items()):
            if not _memory_limit(str(name)):
                c.add(
                    f"{path}.limits.{name}",
                    f"the limit type {name!r} for NUMA node {node} is not supported, only "
                    "memory and hugepages-<HugePageSize> are accepted",
                )
                continue
            try:
                amount = parse_quantity(str(quantity))
            except ValueError as err:
                c.add(f"{path}.limits.{name}", str(err))
                continue
            if amount == 0:
                c.add(
                    f"{path}.limits.{name}",
                    f"reserved memory may not be zero for NUMA node {node} and resource {name!r}",
                )
            if (node, str(name)) in seen:
                c.add(
                    f"{path}.limits.{name}",
                    "the reserved memory has a duplicate value for NUMA node "
                    f"{node} and resource {name!r}",
                )
            seen.add((node, str(name)))
    if cfg.memory_manager_policy == "Static" and not cfg.reserved_memory:
        c.add(
            "memoryManagerPolicy",
            "Static needs reservedMemory: the static policy requires the system reserved "
            "memory per NUMA node (reservedMemory)",
        )
    options = cfg.topology_manager_policy_options
    if options and not cfg.feature_gates.get("TopologyManagerPolicyOptions", True):
        c.add(
            "topologyManagerPolicyOptions",
            "requires feature gate TopologyManagerPolicyOptions",
        )
    for name, value in sorted(options.items()):
        where = f"topologyManagerPolicyOptions.{name}"
        if name not in _TOPOLOGY_OPTIONS:
            c.add(
                where,
                f"unknown Topology Manager Policy option (one of {', '.join(_TOPOLOGY_OPTIONS)})",
            )
        elif name == "prefer-closest-numa-nodes" and value not in _GO_BOOLS:
            c.add(where, f"must be true or false, not {value!r}")
        elif name == "max-allowable-numa-nodes":
            if not cfg.feature_gates.get("TopologyManagerPolicyBetaOptions", True):
                c.add(
                    where, "a beta option: requires feature gate TopologyManagerPolicyBetaOptions"
                )
            if not value.isdigit() or int(value) < 8:
                c.add(where, f"must be an integer of at least 8, not {value!r}")


def with_reserved_system_cpus(cfg: KubeletConfiguration) -> KubeletConfiguration:
    """reservedSystemCPUs as upstream's kubelet applies it at start: system-reserved cpu
    becomes their count and kube-reserved cpu goes, so the Node's allocatable and
    admission leave exactly those CPUs to the system. Unchanged without the field."""
    reserved = parse_cpus(cfg.reserved_system_cpus)
    if not reserved:
        return cfg
    kube = {k: v for k, v in cfg.kube_reserved.items() if k != "cpu"}
    system = {**cfg.system_reserved, "cpu": str(len(reserved))}
    return dataclasses.replace(cfg, kube_reserved=kube, system_reserved=system)


def _check_reserved_enforcement(c: _Checks, cfg: KubeletConfiguration) -> None:
    """What klet does not do of system-reserved/kube-reserved enforcement (syncloop's
    reservedcgroups.py writes the rest): huge pages."""
    for field, prefix, reserved in (
        ("systemReserved", "system-reserved", cfg.system_reserved),
        ("kubeReserved", "kube-reserved", cfg.kube_reserved),
    ):
        full = prefix in cfg.enforce_node_allocatable
        for resource in reserved:
            if full and resource.startswith("hugepages-"):
                c.add(
                    f"{field}.{resource}",
                    f"with enforceNodeAllocatable {prefix}: not implemented by klet: "
                    "hugetlb limits on a reserved cgroup",
                )


def _check_eviction(c: _Checks, cfg: KubeletConfiguration) -> None:
    c.thresholds("evictionHard", cfg.eviction_hard, quantities=True)
    c.thresholds("evictionSoft", cfg.eviction_soft, quantities=True)
    c.thresholds("evictionMinimumReclaim", cfg.eviction_minimum_reclaim, quantities=True)
    c.thresholds("evictionSoftGracePeriod", cfg.eviction_soft_grace_period, quantities=False)
    for signal, seconds in cfg.eviction_soft_grace_period.items():
        c.non_negative(f"evictionSoftGracePeriod.{signal}", seconds)
    for signal in cfg.eviction_soft:
        if signal in EVICTION_SIGNALS and signal not in cfg.eviction_soft_grace_period:
            c.add(
                f"evictionSoft.{signal}",
                "needs a grace period in evictionSoftGracePeriod",
            )
    c.non_negative("evictionPressureTransitionPeriod", cfg.eviction_pressure_transition_period)


def _check_implemented(c: _Checks, cfg: KubeletConfiguration) -> None:
    """Values klet would accept and ignore are refused instead (see support.py)."""
    already = {p.path for p in c.problems}  # an invalid value needs one message, not two
    for path, message in unimplemented_problems(cfg):
        if path not in already:
            c.add(path, message)


def _check_gates(c: _Checks, cfg: KubeletConfiguration) -> None:
    """Unknown, locked and unimplemented feature gates (see gates.py)."""
    for path, message in gate_problems(cfg.feature_gates):
        c.add(path, message)


def validate_problems(cfg: KubeletConfiguration) -> list[Problem]:
    """Every value problem of `cfg`, each with its upstream field path."""
    c = _Checks()
    for check in (
        _check_serving,
        _check_sources,
        _check_runtime,
        _check_image_gc,
        _check_node,
        _check_cgroups,
        _check_eviction,
        _check_gates,
        _check_implemented,
    ):
        check(c, cfg)
    return c.problems


def validate(cfg: KubeletConfiguration) -> list[str]:
    """Every value problem of `cfg` as "<field path>: <message>" lines; empty when valid."""
    return [str(p) for p in validate_problems(cfg)]

"""Which KubeletConfiguration fields klet accepts without acting on them, and why.

klet loads every upstream field so a file written for the upstream kubelet decodes, but a
setting that is accepted and silently ignored is worse than an error: the operator
believes the node is protected (rotated certificates, a CPU manager, graceful shutdown)
when it is not. So each field no klet code reads is listed here with the reason, and the
values klet does implement (always the default); validation refuses any other value,
naming the field (or the flag that set it).

A few fields are listed as `ACCEPTED`: any value loads, because klet's behaviour already
is what the value asks for, or the field has no effect in the configuration klet allows
(as upstream, a CPU manager reconcile period means nothing with cpuManagerPolicy none).
Their reason says which default klet does not honour, where that is the case.

`tools/config_fields.py` finds the fields nothing in libs/ or services/ reads and prints
this table; a unit test fails when a field is read by nothing and not listed here, or is
listed as refused although some code now reads it.

Trade-off: the allowed values are predicates over the decoded value, not a schema; the
table is short enough to read, and each predicate is tested against the field's default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from klet.config.kubelet import KubeletConfiguration, nested_class

__all__ = [
    "ACCEPTED",
    "DEFAULT",
    "all_paths",
    "IN_PROGRESS",
    "UNIMPLEMENTED",
    "Unimplemented",
    "field_value",
    "unimplemented_problems",
]

DEFAULT = object()  # "the field's default" in an Unimplemented's allowed values


class Unimplemented(NamedTuple):
    """A field klet does not implement: which values it accepts, and why."""

    reason: str  # what klet does not do, in a phrase
    allowed: tuple[Any, ...] = (DEFAULT,)  # accepted values; DEFAULT = the default
    check: Callable[[Any], bool] | None = None  # overrides `allowed` when set
    partial: bool = False  # klet reads the field and implements some of its values
    shown: str = "empty"  # the accepted values in words, when `check` decides

    def accepts(self, value: Any, default: Any) -> bool:
        if self.check is not None:
            return self.check(value)
        return any(value == (default if a is DEFAULT else a) for a in self.allowed)


def _empty(value: Any) -> bool:
    return not value


def _zero_options(value: Any) -> bool:
    """logging.options holds only zero values (kubeadm writes `infoBufferSize: "0"`)."""
    if isinstance(value, Mapping):
        return all(_zero_options(v) for v in value.values())
    return value in (None, False, 0, "", "0", [], {})


def _enforce_keys(value: Any) -> bool:
    return all(k in ("pods", "none") for k in value)


# Upstream dotted path -> what klet does not do. A value the field accepts loads; any
# other is refused at start with "<field>: not implemented by klet: <reason>".
UNIMPLEMENTED: Mapping[str, Unimplemented] = {
    # --- serving and certificates
    "rotateCertificates": Unimplemented("client certificate rotation through the certificates API"),
    "serverTLSBootstrap": Unimplemented(
        "serving certificates from the certificates API (klet uses tlsCertFile/"
        "tlsPrivateKeyFile or a self-signed certificate)"
    ),
    "enableContentionProfiling": Unimplemented("profiling handlers"),
    "enableSystemLogQuery": Unimplemented("the /logs/ node log query"),
    "showHiddenMetricsForVersion": Unimplemented("hidden metrics"),
    "tracing": Unimplemented("OpenTelemetry tracing"),
    "logging.vmodule": Unimplemented("per-file log verbosity", check=_empty),
    "logging.options": Unimplemented(
        "klog's output options (buffering, split streams)",
        check=_zero_options,
        shown="zero values only",
    ),
    # --- pod sources, images
    "podHousekeepingPeriod": Unimplemented("a configurable pod housekeeping period"),
    "imagePullCredentialsVerificationPolicy": Unimplemented(
        "verifying pull credentials of images already on the node: every pod may use "
        "every image present (as NeverVerify)",
        allowed=(DEFAULT, "NeverVerify"),
    ),
    "preloadedImagesVerificationAllowlist": Unimplemented(
        "verifying pull credentials of preloaded images", check=_empty
    ),
    # --- pods
    "podsPerCore": Unimplemented("a per-core pod limit (maxPods is enforced)"),
    "podCIDR": Unimplemented(
        "handing a pod CIDR to the runtime (the CNI configuration assigns pod IPs)"
    ),
    "userNamespaces.idsPerPod": Unimplemented("pod user namespaces (hostUsers: false)"),
    "runOnce": Unimplemented(
        "run-once mode (upstream v1.34 refuses runOnce: true too; the mode is deprecated)"
    ),
    "shutdownGracePeriod": Unimplemented("graceful node shutdown"),
    "shutdownGracePeriodCriticalPods": Unimplemented("graceful node shutdown"),
    "shutdownGracePeriodByPodPriority": Unimplemented("graceful node shutdown", check=_empty),
    "configMapAndSecretChangeDetectionStrategy": Unimplemented(
        "choosing how ConfigMap and Secret changes are detected"
    ),
    # --- cgroups and node resources
    "cgroupDriver": Unimplemented("the systemd cgroup driver (pod cgroups are cgroupfs paths)"),
    "cgroupRoot": Unimplemented(
        "a cgroup root other than / (pods go under /kubepods)", allowed=(DEFAULT, "/")
    ),
    "kubeletCgroups": Unimplemented("moving its own processes into a cgroup"),
    "systemCgroups": Unimplemented("moving system processes into a cgroup"),
    "kubeReservedCgroup": Unimplemented("enforcing kubeReserved on a cgroup"),
    "systemReservedCgroup": Unimplemented("enforcing systemReserved on a cgroup"),
    "enforceNodeAllocatable": Unimplemented(
        "enforcing system-reserved or kube-reserved on their cgroups",
        check=_enforce_keys,
        shown="pods and none only",
        partial=True,  # "pods" is read by eviction's allocatable thresholds
    ),
    "reservedSystemCPUs": Unimplemented("reserving CPUs for the system"),
    "reservedMemory": Unimplemented("the memory manager's NUMA reservations", check=_empty),
    "cpuManagerPolicy": Unimplemented("the static CPU manager policy"),
    "cpuManagerPolicyOptions": Unimplemented("CPU manager policy options", check=_empty),
    "memoryManagerPolicy": Unimplemented("the Static memory manager policy"),
    "topologyManagerPolicy": Unimplemented("topology manager policies"),
    "topologyManagerPolicyOptions": Unimplemented("topology manager options", check=_empty),
    "qosReserved": Unimplemented("QoS-level memory reservation", check=_empty),
    "memorySwap.swapBehavior": Unimplemented("LimitedSwap", allowed=(DEFAULT, "NoSwap")),
    "singleProcessOOMKill": Unimplemented(
        "memory.oom.group: an OOM kill takes one process, never the whole container",
        allowed=(None, True),
    ),
    "failCgroupV1": Unimplemented("refusing to start on cgroup v1"),
    "kernelMemcgNotification": Unimplemented("memcg threshold notifications (eviction polls)"),
    "volumeStatsAggPeriod": Unimplemented(
        "a background volume usage period (usage is measured when asked)"
    ),
    "volumePluginDir": Unimplemented("FlexVolume plugins"),
}

# Fields any value of which loads: klet already behaves as the value asks, or the field
# has no effect in what klet accepts. Upstream path -> why.
ACCEPTED: Mapping[str, str] = {
    "logging.flushFrequency": "klet writes every log record at once; nothing to flush",
    "contentType": "default protobuf not honoured: klet's apiserver client speaks JSON",
    "cpuManagerReconcilePeriod": "no effect: only cpuManagerPolicy none is accepted",
    "topologyManagerScope": "no effect: only topologyManagerPolicy none is accepted",
    "memoryThrottlingFactor": "no effect without the MemoryQoS feature (as upstream)",
    "hairpinMode": "no effect with a CRI runtime (as upstream): the CNI plugin decides",
    "iptablesMasqueradeBit": "no effect: klet creates no iptables rules",
    "iptablesDropBit": "no effect: klet creates no iptables rules",
    "makeIPTablesUtilChains": "default true not honoured: klet creates no iptables chains",
    "enableSystemLogHandler": "default true not honoured: klet serves no /logs/",
    "enableProfilingHandler": "default true not honoured: klet serves no /debug/pprof",
    "enableDebugFlagsHandler": "default true not honoured: klet serves no /debug/flags/v",
}

# Fields applied by work merged alongside this table (issue 11: maxOpenFiles by the
# services' start-up, the container log fields by log rotation). Neither refused nor
# reported; the consistency test skips them. Delete an entry once its reader is in.
IN_PROGRESS: frozenset[str] = frozenset()


def field_value(cfg: Any, path: str) -> tuple[Any, Any]:
    """The value at upstream dotted `path` of `cfg` and the field's default."""
    obj = cfg
    value: Any = None
    default: Any = None
    for part in path.split("."):
        by_json = {f.metadata["json"]: f for f in dataclasses.fields(obj)}
        f = by_json[part]
        value = getattr(obj, f.name)
        default = _default_of(f)
        if f.metadata["kind"] == "nested" and value is None:
            break
        obj = value
    return value, default


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def unimplemented_problems(cfg: KubeletConfiguration) -> list[tuple[str, str]]:
    """(field path, message) for every field set to a value klet does not implement."""
    out: list[tuple[str, str]] = []
    for path, rule in UNIMPLEMENTED.items():
        value, default = field_value(cfg, path)
        if not rule.accepts(value, default):
            out.append((path, f"not implemented by klet: {rule.reason}"))
    return out


def all_paths(cls: type[Any] = KubeletConfiguration, prefix: str = "") -> list[str]:
    """Every leaf field's upstream dotted path (a nested block counts as its leaves;
    an optional block such as `tracing` counts as itself)."""
    out: list[str] = []
    for f in dataclasses.fields(cls):
        path = prefix + f.metadata["json"]
        if f.metadata["kind"] == "nested" and f.default is not None:
            out += all_paths(nested_class(f), path + ".")
        else:
            out.append(path)
    return out

"""Which KubeletConfiguration fields klet does not act on, and what it does about each.

klet loads every upstream field so a file written for the upstream kubelet decodes, but a
setting that is accepted and silently ignored is worse than an error: the operator
believes the node is protected (rotated certificates, a memory manager, graceful shutdown)
when it is not. So every field no klet code reads is in one of three tables:

- `UNIMPLEMENTED`: the values klet implements (the default, sometimes one more);
  validation refuses any other value, naming the field (or the flag that set it).
- `NO_EFFECT`: the field does nothing in upstream's kubelet either, in every
  configuration klet accepts. Each names the refused field or feature gate that would
  give it an effect (`memoryThrottlingFactor` means nothing unless the MemoryQoS gate
  is on, which klet refuses), or says why it has none upstream at all
  (upstream v1.34 reads `hairpinMode` nowhere).
- `NOT_HONOURED`: upstream's default asks for something klet does not do, and the other
  value says what klet does (`enableProfilingHandler` defaults to true; klet serves no
  /debug/pprof/). Refusing the default would refuse every upstream file, so it loads,
  and the service that would act on it logs a WARNING at start naming the field, until
  the file says what klet does (`not_honoured`).

`tools/config_fields.py` finds the fields nothing in libs/ or services/ reads; a unit
test fails when such a field is in none of the tables, when a NO_EFFECT entry's
governing field or gate is not refused, or when a field listed here is read after all.

Trade-off: the allowed values are predicates over the decoded value, not a schema; the
table is short enough to read, and each predicate is tested against the field's default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from klet.config.kubelet import KubeletConfiguration, nested_class

__all__ = [
    "DEFAULT",
    "NOT_HONOURED",
    "NO_EFFECT",
    "UNIMPLEMENTED",
    "NoEffect",
    "NotHonoured",
    "Unimplemented",
    "all_paths",
    "field_value",
    "not_honoured",
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


_CPU_OPTIONS_NOT_IMPLEMENTED = (
    "distribute-cpus-across-numa",
    "prefer-align-cpus-by-uncorecache",
    "align-by-socket",
)


def _cpu_options_implemented(value: Any) -> bool:
    """No option klet lacks (klet.syncloop.cpumanager.policy) is turned on."""
    if not isinstance(value, Mapping):
        return False
    return not any(
        name in _CPU_OPTIONS_NOT_IMPLEMENTED and str(v).lower() in ("1", "t", "true")
        for name, v in value.items()
    )


# Upstream dotted path -> what klet does not do. A value the field accepts loads; any
# other is refused at start with "<field>: not implemented by klet: <reason>".
UNIMPLEMENTED: Mapping[str, Unimplemented] = {
    # --- serving and certificates
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
    "configMapAndSecretChangeDetectionStrategy": Unimplemented(
        "choosing how ConfigMap and Secret changes are detected"
    ),
    # --- cgroups and node resources
    "kubeletCgroups": Unimplemented("moving its own processes into a cgroup"),
    "systemCgroups": Unimplemented("moving system processes into a cgroup"),
    "cpuManagerPolicyOptions": Unimplemented(
        "the CPU manager options distribute-cpus-across-numa, "
        "prefer-align-cpus-by-uncorecache and align-by-socket",
        check=_cpu_options_implemented,
        partial=True,
        shown="full-pcpus-only, strict-cpu-reservation, distribute-cpus-across-cores "
        "(the others only false)",
    ),
    "qosReserved": Unimplemented("QoS-level memory reservation", check=_empty),
    "memorySwap.swapBehavior": Unimplemented("LimitedSwap", allowed=(DEFAULT, "NoSwap")),
    "failCgroupV1": Unimplemented("refusing to start on cgroup v1"),
    "kernelMemcgNotification": Unimplemented("memcg threshold notifications (eviction polls)"),
    "volumePluginDir": Unimplemented("FlexVolume plugins"),
    # --- volumes
    "enableControllerAttachDetach": Unimplemented(
        "attaching and detaching volumes from the node itself: klet leaves both to the "
        "attach-detach controller (the Node's volumes.kubernetes.io/controller-managed-"
        "attach-detach annotation), so with false nothing would create the "
        "VolumeAttachment of an attachable CSI volume and its pod would wait forever",
        partial=True,
    ),
}


class NoEffect(NamedTuple):
    """A field that does nothing in any configuration klet accepts, as upstream."""

    reason: str
    # The field (upstream path) or gate ("featureGates.NAME") that would give it an
    # effect, refused by klet away from its default; None: upstream reads it nowhere.
    unless: str | None = None


NO_EFFECT: Mapping[str, NoEffect] = {
    "logging.flushFrequency": NoEffect(
        "upstream ignores it for a log backend that does not buffer, and klet's writes "
        "every record at once"
    ),
    "memoryThrottlingFactor": NoEffect(
        "sets memory.high under MemoryQoS", unless="featureGates.MemoryQoS"
    ),
    "hairpinMode": NoEffect("upstream v1.34 validates it and reads it nowhere"),
    "iptablesMasqueradeBit": NoEffect("upstream v1.34 validates it and reads it nowhere"),
    "iptablesDropBit": NoEffect("upstream v1.34 validates it and reads it nowhere"),
}


class NotHonoured(NamedTuple):
    """A field whose upstream default asks for what klet does not do."""

    reason: str  # what klet does not do, in a phrase
    implemented: Any  # the value that says what klet does; it silences the warning
    service: str  # the service that would act on the field, and warns
    # Upstream serves the handler only with enableServer and enableDebuggingHandlers.
    debugging_handler: bool = False
    needs_apiserver: bool = False  # only means something with an apiserver (--kubeconfig)


NOT_HONOURED: Mapping[str, NotHonoured] = {
    "makeIPTablesUtilChains": NotHonoured(
        "the KUBE-IPTABLES-HINT and KUBE-FIREWALL iptables chains", False, "syncloop"
    ),
    "enableProfilingHandler": NotHonoured(
        "the /debug/pprof/ handlers", False, "status-reporter", debugging_handler=True
    ),
    "enableDebugFlagsHandler": NotHonoured(
        "the /debug/flags/v handler", False, "status-reporter", debugging_handler=True
    ),
    "contentType": NotHonoured(
        "protobuf requests to the apiserver (klet's client speaks JSON)",
        "application/json",
        "status-reporter",
        needs_apiserver=True,
    ),
}


def _show_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def not_honoured(cfg: KubeletConfiguration, *, service: str, standalone: bool) -> list[str]:
    """The WARNING lines `service` logs at start: each NOT_HONOURED field of its own
    whose value asks for what klet does not do."""
    out: list[str] = []
    for path, rule in NOT_HONOURED.items():
        if rule.service != service:
            continue
        if rule.debugging_handler and not (cfg.enable_server and cfg.enable_debugging_handlers):
            continue
        if rule.needs_apiserver and standalone:
            continue
        value, default = field_value(cfg, path)
        if value == rule.implemented:
            continue
        which = " (the default)" if value == default else ""
        out.append(
            f"{path}: {_show_value(value)}{which} asks for {rule.reason}, which klet does "
            f"not implement; set {path}: {_show_value(rule.implemented)} to say so"
        )
    return out


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

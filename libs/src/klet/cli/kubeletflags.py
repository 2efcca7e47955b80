"""The upstream kubelet's command line, flag by flag: what the `kubelet` entry point does
with each of the v1.34.4 kubelet's flags (`klet.config.kubeletflaglist`, generated from
upstream's source).

Every upstream flag has exactly one state here; a unit test fails when upstream's list and
this table part. klet's own parser (`klet.config.flags.FLAGS`) stays the implementation:

- **Implemented**: klet's parser has the flag under the same name and acts on it (a value
  klet does not implement is refused by validation, naming the flag). Upstream marks most
  of these deprecated ("should be set via the config file"); the entry point prints
  upstream's warning for each one used, as pflag does, and the flag still works.
- **Handled**: answered by the entry point itself (`--help`, `--version`).
- **Ignored**: upstream accepts it deprecated and klet has its effect by other means, or
  it has no effect in upstream's kubelet either; accepted with upstream's warning and
  dropped before klet's parser sees it. Each says why.
- **Refused**: klet does not have what the flag controls; the entry point exits naming the
  flag and why, before anything starts, rather than run a node that ignores it.

`translate` is the pure step the entry point runs: argv in upstream's pflag syntax
(`--name=value`, `--name value`, a bool flag alone, `-v 2`, underscores for dashes) to the
argv klet's parser gets, the warnings to print, and the problems that refuse the start.
Flags upstream does not have pass to klet's parser when klet has them (`--redis-url` and
the rest of klet's own); any other is refused as pflag refuses it ("unknown flag").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from klet.config.flags import FLAGS
from klet.config.kubeletflaglist import FLAGS as UPSTREAM

__all__ = [
    "STATES",
    "Handled",
    "Ignored",
    "Implemented",
    "Refused",
    "Translation",
    "translate",
]


class Implemented(NamedTuple):
    """klet's parser has the flag (klet.config.flags.FLAGS) under upstream's name."""


class Handled(NamedTuple):
    """The entry point answers it itself."""

    what: str


class Ignored(NamedTuple):
    """Accepted with upstream's deprecation warning and dropped: klet has the effect by
    other means, or it has none upstream either."""

    reason: str


class Refused(NamedTuple):
    """klet does not have what the flag controls."""

    reason: str


State = Implemented | Handled | Ignored | Refused

_NO_CADVISOR = (
    "klet has no cAdvisor: its stats come from the cgroups and CRI (klet.stats), and "
    "nothing reads this cAdvisor setting"
)
_CADVISOR_STORAGE = (
    "a cAdvisor storage-driver setting; the kubelet starts no cAdvisor storage driver, so "
    "it has no effect upstream either"
)

STATES: Mapping[str, State] = {
    **{
        name: Implemented()
        for name in (
            "address",
            "allowed-unsafe-sysctls",
            "anonymous-auth",
            "authentication-token-webhook",
            "authentication-token-webhook-cache-ttl",
            "authorization-mode",
            "authorization-webhook-cache-authorized-ttl",
            "authorization-webhook-cache-unauthorized-ttl",
            "bootstrap-kubeconfig",
            "cert-dir",
            "cgroup-driver",
            "cgroup-root",
            "cgroups-per-qos",
            "client-ca-file",
            "cloud-provider",
            "cluster-dns",
            "cluster-domain",
            "config",
            "config-dir",
            "container-log-max-files",
            "container-log-max-size",
            "container-runtime-endpoint",
            "contention-profiling",
            "cpu-cfs-quota",
            "cpu-cfs-quota-period",
            "cpu-manager-policy",
            "cpu-manager-policy-options",
            "cpu-manager-reconcile-period",
            "enable-controller-attach-detach",
            "enable-debugging-handlers",
            "enable-server",
            "enforce-node-allocatable",
            "event-burst",
            "event-qps",
            "eviction-hard",
            "eviction-max-pod-grace-period",
            "eviction-minimum-reclaim",
            "eviction-pressure-transition-period",
            "eviction-soft",
            "eviction-soft-grace-period",
            "fail-cgroupv1",
            "fail-swap-on",
            "feature-gates",
            "file-check-frequency",
            "hairpin-mode",
            "healthz-bind-address",
            "healthz-port",
            "hostname-override",
            "http-check-frequency",
            "image-credential-provider-bin-dir",
            "image-credential-provider-config",
            "image-gc-high-threshold",
            "image-gc-low-threshold",
            "image-service-endpoint",
            "kernel-memcg-notification",
            "kube-api-burst",
            "kube-api-content-type",
            "kube-api-qps",
            "kube-reserved",
            "kube-reserved-cgroup",
            "kubeconfig",
            "kubelet-cgroups",
            "local-storage-capacity-isolation",
            "log-flush-frequency",
            "logging-format",
            "make-iptables-util-chains",
            "manifest-url",
            "manifest-url-header",
            "max-open-files",
            "max-pods",
            "maximum-dead-containers",
            "maximum-dead-containers-per-container",
            "memory-manager-policy",
            "minimum-container-ttl-duration",
            "minimum-image-ttl-duration",
            "node-ip",
            "node-labels",
            "node-status-max-images",
            "node-status-update-frequency",
            "oom-score-adj",
            "pod-cidr",
            "pod-manifest-path",
            "pod-max-pids",
            "pods-per-core",
            "port",
            "protect-kernel-defaults",
            "provider-id",
            "qos-reserved",
            "read-only-port",
            "register-node",
            "register-with-taints",
            "registry-burst",
            "registry-qps",
            "reserved-cpus",
            "reserved-memory",
            "resolv-conf",
            "root-dir",
            "rotate-certificates",
            "rotate-server-certificates",
            "runonce",
            "runtime-request-timeout",
            "seccomp-default",
            "serialize-image-pulls",
            "streaming-connection-idle-timeout",
            "sync-frequency",
            "system-cgroups",
            "system-reserved",
            "system-reserved-cgroup",
            "tls-cert-file",
            "tls-cipher-suites",
            "tls-min-version",
            "tls-private-key-file",
            "topology-manager-policy",
            "topology-manager-policy-options",
            "topology-manager-scope",
            "v",
            "volume-plugin-dir",
            "volume-stats-agg-period",
        )
    },
    "help": Handled("prints this entry point's usage and exits"),
    "version": Handled('prints "Kubernetes <version>-klet", the form kubeadm parses, and exits'),
    "pod-infra-container-image": Ignored(
        "in v1.34 its only effect upstream is that image GC never removes that image; klet's "
        "image GC never removes the runtime's sandbox image (CRI's, which kubeadm sets to "
        "the same image), so the flag's value itself is not read"
    ),
    **{
        name: Ignored(_CADVISOR_STORAGE)
        for name in (
            "storage-driver-buffer-duration",
            "storage-driver-db",
            "storage-driver-host",
            "storage-driver-password",
            "storage-driver-secure",
            "storage-driver-table",
            "storage-driver-user",
        )
    },
    **{
        name: Refused(_NO_CADVISOR)
        for name in (
            "application-metrics-count-limit",
            "boot-id-file",
            "container-hints",
            "containerd",
            "containerd-namespace",
            "enable-load-reader",
            "event-storage-age-limit",
            "event-storage-event-limit",
            "global-housekeeping-interval",
            "housekeeping-interval",
            "log-cadvisor-usage",
            "machine-id-file",
        )
    },
    "exit-on-lock-contention": Refused(
        "klet takes no lock file and does not exit when another process wants one"
    ),
    "lock-file": Refused("klet takes no lock file (its services hold leases on the bus)"),
    "experimental-allocatable-ignore-eviction": Refused(
        "klet always subtracts the hard eviction thresholds from allocatable"
    ),
    "experimental-mounter-path": Refused("klet mounts with the host's own mount binary"),
    "log-text-info-buffer-size": Refused(
        "klet's log lines are written unbuffered (logging.options.text is not implemented)"
    ),
    "log-text-split-stream": Refused(
        "klet writes every log line to one stream (logging.options.text is not implemented)"
    ),
    "runtime-cgroups": Refused("klet does not move the container runtime into a cgroup"),
    "vmodule": Refused("klet's services have no per-file log verbosity (logging.vmodule); use -v"),
}

_KLET = {spec.flag[2:]: spec for spec in FLAGS}
_SHORT = {"v": "v", "h": "help"}
_DEPRECATION = "Flag --{name} has been deprecated, {message}"


@dataclass
class Translation:
    """What the entry point does with one command line."""

    argv: list[str] = field(default_factory=list)  # for klet's parser
    warnings: list[str] = field(default_factory=list)  # upstream's deprecation lines
    problems: list[str] = field(default_factory=list)  # each refuses the start
    help: bool = False
    version: bool = False


def _takes_value(name: str) -> bool:
    upstream = UPSTREAM.get(name)
    if upstream is not None:
        return not upstream.no_value
    return not _KLET[name].optional_value


def translate(argv: Sequence[str]) -> Translation:
    """Split `argv` as upstream's pflag does and decide each flag by STATES."""
    out = Translation()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out.problems.extend(f"unexpected argument {a!r}" for a in argv[i:])
            break
        if not arg.startswith("-") or arg == "-":
            out.problems.append(f"unexpected argument {arg!r}: the kubelet takes flags only")
            continue
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
        else:  # a shorthand: -v 2, -v=2, -v2, -h
            short, rest = arg[1:2], arg[2:]
            if short not in _SHORT:
                out.problems.append(f"unknown shorthand flag: {short!r} in {arg}")
                continue
            name = _SHORT[short]
            eq, value = ("=", rest[1:]) if rest.startswith("=") else ("=" if rest else "", rest)
        if name not in UPSTREAM and name not in _KLET:
            out.problems.append(f"unknown flag: --{name}")
            continue
        given = [f"--{name}"]
        if eq:
            given[0] += f"={value}"
        elif _takes_value(name):
            if i >= len(argv):
                out.problems.append(f"flag needs an argument: --{name}")
                continue
            value = argv[i]
            given.append(value)
            i += 1
        state = STATES.get(name, Implemented())  # klet's own flags: its parser's
        upstream = UPSTREAM.get(name)
        if isinstance(state, Refused):
            out.problems.append(f"--{name}: not implemented by klet: {state.reason}")
            continue
        if upstream is not None and upstream.deprecated:
            out.warnings.append(_DEPRECATION.format(name=name, message=upstream.deprecated))
        if isinstance(state, Handled):
            truth = value if eq else "true"
            if name == "help":
                out.help = truth in ("1", "t", "T", "true", "TRUE", "True")
            else:
                out.version = truth in ("1", "t", "T", "true", "TRUE", "True")
            continue
        if isinstance(state, Implemented):
            out.argv.extend(given)
    return out

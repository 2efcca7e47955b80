"""Which pod sysctls this node allows: upstream's sysctl admit handler, as pure functions.

Upstream's kubelet admits a pod only when every sysctl of its securityContext is on the
node's allowlist: the safe sysctls (namespaced by the kernel and unable to affect other
pods or the node) plus the operator's `allowedUnsafeSysctls` (names, or prefixes ending
in `*`). A pod naming any other sysctl is rejected before its sandbox exists, reason
`SysctlForbidden`, message `forbidden sysctl: "kernel.msgmax" not allowlisted`. Without
this check the runtime receives the sysctl, and a value the kernel refuses leaves the
pod in sandbox creation errors forever instead of Failed.

An allowed sysctl of the network namespace is still refused to a hostNetwork pod, and
one of the IPC namespace to a hostIPC pod (`"net.ipv4.tcp_syncookies" not allowed with
host Net enabled`): the pod would change the host's value. Only sysctls whose namespace
is known can be allowlisted; an `allowedUnsafeSysctls` entry of an unknown one is left
out (upstream refuses to start with it).

The safe list is upstream's for kernels that namespace all of them (5.x and later):
klet does not drop the newer ones on old kernels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from klet.model.types import JSON
from klet.syncloop.containers.security import normalize_sysctl_name

FORBIDDEN_REASON = "SysctlForbidden"
IPC = "IPC"
NET = "Net"

SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
)

# The sysctls the kernel namespaces per IPC namespace, by name; and by prefix (`net.`,
# `fs.mqueue.`). `kernel.shm` and `kernel.msg` stand for their families in patterns.
_IPC_NAMES = frozenset(
    {
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
        "kernel.shm",
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.msg",
    }
)
_PREFIX_NAMESPACES = (("net.", NET), ("fs.mqueue.", IPC))


def namespace_of(name: str) -> str | None:
    """The kernel namespace of a sysctl (or of a pattern's prefix), None if unknown."""
    if name in _IPC_NAMES:
        return IPC
    return next((ns for prefix, ns in _PREFIX_NAMESPACES if name.startswith(prefix)), None)


@dataclass(frozen=True)
class SysctlAllowlist:
    """Allowed sysctls by exact name and by prefix, each with its namespace."""

    names: Mapping[str, str] = field(default_factory=dict)
    prefixes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, unsafe: Iterable[str] = ()) -> SysctlAllowlist:
        """The safe sysctls plus `unsafe` (allowedUnsafeSysctls: names or `prefix*`)."""
        names: dict[str, str] = {}
        prefixes: dict[str, str] = {}
        for pattern in (*SAFE_SYSCTLS, *unsafe):
            normalized = normalize_sysctl_name(pattern)
            stem, star, _ = normalized.partition("*")
            ns = namespace_of(stem)
            if ns is None:
                continue
            (prefixes if star else names)[stem] = ns
        return cls(names=names, prefixes=prefixes)

    def problem(self, name: str, *, host_network: bool, host_ipc: bool) -> str | None:
        """Why the sysctl `name` is not allowed for the pod, or None when it is."""
        name = normalize_sysctl_name(name)
        ns = self.names.get(name)
        if ns is None:
            ns = next((n for p, n in self.prefixes.items() if name.startswith(p)), None)
        if ns is None:
            return f'"{name}" not allowlisted'
        if (ns == IPC and host_ipc) or (ns == NET and host_network):
            return f'"{name}" not allowed with host {ns} enabled'
        return None

    def check(self, pod: JSON) -> str | None:
        """The rejection message for the first sysctl of `pod` not allowed, or None."""
        spec: JSON = pod.get("spec") or {}
        for sysctl in (spec.get("securityContext") or {}).get("sysctls") or ():
            why = self.problem(
                str(sysctl.get("name", "")),
                host_network=bool(spec.get("hostNetwork")),
                host_ipc=bool(spec.get("hostIPC")),
            )
            if why is not None:
                return f"forbidden sysctl: {why}"
        return None

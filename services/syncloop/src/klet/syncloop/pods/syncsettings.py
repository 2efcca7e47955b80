"""SyncSettings: the node configuration SyncPod works with (log and root directories,
cgroup and CPU-quota policy, node facts, hook timeout, seccomp and DNS).

Its own module so the executor (pods/syncpod.py) and the container starter
(containers/startcontainer.py) both read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from klet.syncloop.containers.security import SecuritySettings
from klet.syncloop.environment.dns import DNSSettings
from klet.syncloop.environment.envvars import NodeFacts


@dataclass(frozen=True)
class SyncSettings:
    pod_logs_dir: Path
    cgroups_per_qos: bool = True
    cpu_cfs_quota: bool = True
    """cpuCFSQuota: enforce CPU limits with CFS quota."""
    cpu_cfs_quota_period: float = 0.1
    """cpuCFSQuotaPeriod, seconds."""
    pod_pids_limit: int = -1
    """podPidsLimit: pids.max of every pod cgroup; -1 = no per-pod limit."""
    node: NodeFacts = field(default_factory=NodeFacts)
    root_dir: Path | None = None
    """--root-dir; pods' termination-message files go under <root>/pods/<uid>. None: no files."""
    hook_timeout_s: float = 120.0
    """How long a postStart hook may run (runtimeRequestTimeout), seconds."""
    security: SecuritySettings = field(default_factory=SecuritySettings)
    """seccompDefault and where Localhost seccomp profiles live."""
    dns: DNSSettings | None = None
    """clusterDNS, clusterDomain, resolvConf; None sends no DNS config (the runtime's own)."""

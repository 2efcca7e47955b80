"""SyncSettings: the node configuration SyncPod works with (log and root directories,
cgroup and CPU-quota policy, node facts, hook timeout, seccomp, DNS and how many
sandboxes are created at once).

Its own module so the executor (pods/syncpod.py) and the container starter
(containers/startcontainer.py) both read it. It lives in containers/, not pods/: it is
made of the container floor's settings (security, DNS and node facts from environment/),
and pods/ stands above containers/, never the other way (ARCHITECTURE.md, "Inside
syncloop").
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
    cgroup_root: str = "/"
    """cgroupRoot: pod cgroups go under `<cgroupRoot>/kubepods`."""
    cpu_cfs_quota: bool = True
    """cpuCFSQuota: enforce CPU limits with CFS quota."""
    cpu_cfs_quota_period: float = 0.1
    """cpuCFSQuotaPeriod, seconds."""
    pod_pids_limit: int = -1
    """podPidsLimit: pids.max of every pod cgroup; -1 = no per-pod limit."""
    single_process_oom_kill: bool | None = None
    """singleProcessOOMKill: unless true, containers get memory.oom.group 1 on cgroup v2."""
    node: NodeFacts = field(default_factory=NodeFacts)
    root_dir: Path | None = None
    """--root-dir; pods' termination-message files go under <root>/pods/<uid>. None: no files."""
    hook_timeout_s: float = 120.0
    """How long a postStart hook may run (runtimeRequestTimeout), seconds."""
    security: SecuritySettings = field(default_factory=SecuritySettings)
    """seccompDefault and where Localhost seccomp profiles live."""
    dns: DNSSettings | None = None
    """clusterDNS, clusterDomain, resolvConf; None sends no DNS config (the runtime's own)."""
    parallel_sandbox_creations: int = 8
    """How many RunPodSandbox calls (with the PodSandboxStatus after each) syncloop has
    in flight at once, all pods together; 0 = no limit. containerd does a sandbox's
    work (shim, pause container, CNI plugins and their iptables rules) in parallel, and
    110 at once on 2 cores share it out so that every pod finishes near the end: on raw
    CRI (2026-11-26, a loaded 2-core VM, bench/run.py) 110 pod starts with 8 sandboxes
    at a time had their median pod running in about 7 s against 13 s all at once, and
    the last one at about the same time (12-16 s, 0-12 % sooner in most runs). Pulls and
    container starts are not held. A creation that hangs holds its slot until the CRI
    call's timeout (runtimeRequestTimeout, 2 min)."""

"""What /proc says of a process, for the tiers that check running containers' confinement
(compose, helm) and their cgroup limits (integration, cluster)."""

from __future__ import annotations

from pathlib import Path


def status_field(pid: int | str, name: str) -> str:
    """A field of /proc/<pid>/status (`self` for this process)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise LookupError(f"/proc/{pid}/status has no {name}")


def cgroup_v1_value(pid: int, controller: str, name: str) -> int:
    """An integer file of the process's own v1 cgroup of `controller`. The hierarchy is
    found from the process's /proc/<pid>/cgroup line and mounted under the name of that
    line's controller list: `cpu,cpuacct` on hosts that co-mount them, `cpu` on hosts
    that do not (both are seen on these machines)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            mounted = Path("/sys/fs/cgroup") / controllers
            if not mounted.is_mount():
                raise AssertionError(f"the {controllers} hierarchy is not mounted at {mounted}")
            return int((mounted / path.lstrip("/") / name).read_text())
    raise AssertionError(f"no {controller} cgroup for {pid}")

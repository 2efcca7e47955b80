"""Entry point: `python -m klet.syncloop [kubelet flags]`, and `klet run syncloop`.

Only the shared entry sequence (klet.cli.service) with this service's start-up: the
protectKernelDefaults check (kerneltunables), the reserved cgroups enforceNodeAllocatable
names (they must exist: reservedcgroups), with `cgroupDriver: systemd` the check that
systemd is PID 1 and answers on the system bus, building the dependencies inside the event
loop, and running the root tasks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from klet.cli.service import run_service
from klet.config import ConfigError, Settings


async def start(
    settings: Settings, *, proc_sys: Path | None = None, cgroup_fs: Path = Path("/sys/fs/cgroup")
) -> int | None:
    from klet.syncloop.app import main
    from klet.syncloop.containers.reservedcgroups import (
        missing_reserved_cgroups,
        reserved_cgroups,
    )
    from klet.syncloop.kerneltunables import PROC_SYS, check_kernel_defaults
    from klet.syncloop.wiring import build_deps

    # Before any pod runs, as upstream's container manager checks at start.
    problems = check_kernel_defaults(settings.kubelet.protect_kernel_defaults, proc_sys or PROC_SYS)
    if problems:
        print(f"syncloop: {ConfigError(problems)}", file=sys.stderr)
        return 1
    # A reserved cgroup is never created: upstream's container manager fails its start.
    problems = missing_reserved_cgroups(reserved_cgroups(settings.kubelet), cgroup_fs)
    if problems:
        print(f"syncloop: {ConfigError(problems)}", file=sys.stderr)
        return 1
    if settings.kubelet.cgroup_driver == "systemd":
        problem = await systemd_problem()
        if problem:
            print(f"syncloop: cgroupDriver: systemd: {problem}", file=sys.stderr)
            return 1
    return await main(build_deps(settings))


async def systemd_problem() -> str:
    """Why the systemd cgroup driver cannot work on this host ("" when it can)."""
    from klet.cgroups.systemd import Systemd, preflight

    systemd = Systemd(timeout_s=10.0)
    try:
        return await preflight(systemd)
    finally:
        systemd.close()


def main(argv: list[str] | None = None) -> int:
    return run_service("syncloop", argv, start)


if __name__ == "__main__":
    sys.exit(main())

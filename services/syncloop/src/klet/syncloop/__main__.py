"""Entry point: `python -m klet.syncloop [kubelet flags]`, and `klet run syncloop`.

Only the shared entry sequence (klet.cli.service) with this service's start-up: the
protectKernelDefaults check (kerneltunables), the reserved cgroups enforceNodeAllocatable
names (they must exist: reservedcgroups; with `cgroupDriver: systemd` as active units),
with `cgroupDriver: systemd` the check that systemd is PID 1 and answers on the system
bus, building the dependencies inside the event loop (the CPU manager's state file is
checked there: one that does not fit stops the start), and running the root tasks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from klet.cli.service import run_service
from klet.config import ConfigError, Settings

if TYPE_CHECKING:
    from klet.syncloop.containers.reservedcgroups import ReservedCgroup


async def start(
    settings: Settings, *, proc_sys: Path | None = None, cgroup_fs: Path = Path("/sys/fs/cgroup")
) -> int | None:
    from klet.syncloop.app import main
    from klet.syncloop.containers.reservedcgroups import (
        missing_reserved_cgroups,
        reserved_cgroups,
    )
    from klet.syncloop.cpumanager.manager import CPUManagerError
    from klet.syncloop.kerneltunables import PROC_SYS, check_kernel_defaults
    from klet.syncloop.memorymanager.policy import MemoryManagerError
    from klet.syncloop.wiring import build_deps

    # Before any pod runs, as upstream's container manager checks at start.
    problems = check_kernel_defaults(settings.kubelet.protect_kernel_defaults, proc_sys or PROC_SYS)
    if problems:
        print(f"syncloop: {ConfigError(problems)}", file=sys.stderr)
        return 1
    # A reserved cgroup is never created: upstream's container manager fails its start.
    reserved = reserved_cgroups(settings.kubelet)
    if settings.kubelet.cgroup_driver == "systemd":
        problem, problems = await systemd_problems(reserved)
        if problem:
            print(f"syncloop: cgroupDriver: systemd: {problem}", file=sys.stderr)
            return 1
    else:
        problems = missing_reserved_cgroups(reserved, cgroup_fs)
    if problems:
        print(f"syncloop: {ConfigError(problems)}", file=sys.stderr)
        return 1
    try:
        deps = build_deps(settings)
    except (CPUManagerError, MemoryManagerError) as err:
        # A state file that does not fit, a static policy without reserved CPUs or
        # memory: upstream's container manager does not start either.
        print(f"syncloop: {err}", file=sys.stderr)
        return 1
    return await main(deps)


async def systemd_problems(reserved: Sequence[ReservedCgroup]) -> tuple[str, list[str]]:
    """Why the systemd cgroup driver cannot work on this host ("" when it can), and the
    reserved cgroups' units that are missing."""
    from klet.cgroups.fs import detect
    from klet.cgroups.systemd import Systemd, preflight
    from klet.syncloop.containers.reservedcgroups import SliceWriter, missing_reserved_slices

    systemd = Systemd(timeout_s=10.0)
    try:
        problem = await preflight(systemd)
        if problem or not reserved:
            return problem, []
        writer = SliceWriter(systemd, cgroup_version=detect())
        return "", await missing_reserved_slices(reserved, writer)
    finally:
        systemd.close()


def main(argv: list[str] | None = None) -> int:
    return run_service("syncloop", argv, start)


if __name__ == "__main__":
    sys.exit(main())

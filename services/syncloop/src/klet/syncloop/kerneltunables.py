"""protectKernelDefaults: the kernel sysctls a kubelet node relies on, checked at start.

Upstream's container manager wants six sysctls at fixed values (overcommit always
allowed, the OOM killer rather than a panic on OOM, reboot 10 s after a panic, a panic on
an oops, and room for the root user's kernel keys). With `protectKernelDefaults: true`
it refuses to start, naming every sysctl that differs or cannot be read; with `false` it
rewrites them.

klet implements the `true` side exactly: syncloop (the service that runs pods) refuses to
start, listing each mismatch. On the `false` side it deliberately differs: it never
writes host sysctls, it only logs once which values differ from upstream's. Rewriting
`kernel.panic` and friends on a developer machine or a shared test host (as the upstream
kubelet does) is a surprise no operator asked for; an operator who wants the values sets
them with sysctl.d, and `protectKernelDefaults: true` then proves they are in place.

`tunable_problems` is the pure decision over values read; `read_tunables` is the thin
reader of /proc/sys, which tests point at a directory of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DESIRED", "PROC_SYS", "check_kernel_defaults", "read_tunables", "tunable_problems"]

log = logging.getLogger(__name__)

PROC_SYS = Path("/proc/sys")

# The values upstream's setupKernelTunables expects (pkg/kubelet/cm, release 1.34).
DESIRED: Mapping[str, int] = {
    "vm.overcommit_memory": 1,
    "vm.panic_on_oom": 0,
    "kernel.panic": 10,
    "kernel.panic_on_oops": 1,
    "kernel.keys.root_maxkeys": 1_000_000,
    "kernel.keys.root_maxbytes": 25_000_000,
}


def tunable_problems(
    observed: Mapping[str, str | None], desired: Mapping[str, int] = DESIRED
) -> list[str]:
    """One message per sysctl of `desired` whose observed value differs or is missing
    (None: could not be read), in `desired`'s order."""
    problems: list[str] = []
    for name, want in desired.items():
        got = observed.get(name)
        if got is None:
            problems.append(f"kernel tunable {name}: cannot be read (expected {want})")
            continue
        try:
            value = int(got.strip())
        except ValueError:
            problems.append(f"kernel tunable {name}: expected {want}, got {got.strip()!r}")
            continue
        if value != want:
            problems.append(f"kernel tunable {name}: expected {want}, got {value}")
    return problems


def read_tunables(
    names: Mapping[str, int] = DESIRED, root: Path = PROC_SYS
) -> dict[str, str | None]:
    """The current text of each sysctl (None when it cannot be read)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = (root / name.replace(".", "/")).read_text()
        except (OSError, UnicodeDecodeError):
            out[name] = None
    return out


def check_kernel_defaults(protect: bool, root: Path = PROC_SYS) -> list[str]:
    """The problems that must stop syncloop from starting: with `protect`, every sysctl
    that differs from DESIRED; without it none (the differences are logged, not fixed)."""
    problems = tunable_problems(read_tunables(DESIRED, root))
    if protect:
        return [f"protectKernelDefaults: {p}" for p in problems]
    if problems:
        log.info(
            "kernel tunables differ from the upstream kubelet's; klet leaves them as they are "
            "(protectKernelDefaults: true would refuse to start)",
            extra={"differences": problems},
        )
    return []

"""The open-files limit of a klet service process (KubeletConfiguration `maxOpenFiles`).

Upstream's kubelet sets RLIMIT_NOFILE, soft and hard, to maxOpenFiles (default
1,000,000) when it starts, because it holds a descriptor per watched log, per client
connection of the 10250 API, per CRI stream and per inotify watch; with the common
default soft limit of 1024 a busy node runs out and every new connection fails with
EMFILE. Each klet service runs this once, from the shared entry sequence
(`klet.cli.service.run_service`), before its event loop starts.

The kernel refuses a limit above `/proc/sys/fs/nr_open`, and an unprivileged process
(no CAP_SYS_RESOURCE) may not raise its hard limit. So the wish is clamped to nr_open,
and when setting soft = hard = wish is refused the soft limit is raised as far as the
current hard limit allows. Whatever could not be granted is a WARNING naming the field,
the wish, what the process runs with and why: a service still starts, as upstream's
kubelet does when setrlimit fails, but the operator is told.

`plan_open_files` is the pure decision; `apply_open_files_limit` is the I/O shell
around it, taking a `NofileLimits` so tests need not change the test process's limits.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "NofileLimits",
    "NofileOutcome",
    "ProcessNofileLimits",
    "apply_open_files_limit",
    "plan_open_files",
]

log = logging.getLogger(__name__)

UNLIMITED = resource.RLIM_INFINITY


class NofileLimits(Protocol):
    """The process's RLIMIT_NOFILE and the kernel's ceiling for it."""

    def get(self) -> tuple[int, int]:
        """(soft, hard); RLIM_INFINITY for no limit."""
        ...

    def set(self, soft: int, hard: int) -> None:
        """Raises OSError (EPERM, EINVAL) when the kernel refuses."""
        ...

    def ceiling(self) -> int | None:
        """/proc/sys/fs/nr_open, or None when unknown."""
        ...


class ProcessNofileLimits:
    """The real limits of this process."""

    def get(self) -> tuple[int, int]:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return int(soft), int(hard)

    def set(self, soft: int, hard: int) -> None:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except ValueError as err:  # Python's wrapper for EINVAL
            raise OSError(22, str(err)) from err

    def ceiling(self) -> int | None:
        try:
            return int(Path("/proc/sys/fs/nr_open").read_text().strip())
        except (OSError, ValueError):
            return None


@dataclass(frozen=True)
class NofileOutcome:
    """What the process runs with after `apply_open_files_limit`."""

    wanted: int
    soft: int
    hard: int
    problem: str = ""
    """Why the wish was not (fully) granted; "" when it was."""


def _above(limit: int, value: int) -> bool:
    """Whether `limit` (RLIM_INFINITY = no limit) is at least `value`."""
    return limit == UNLIMITED or limit >= value


def plan_open_files(want: int, soft: int, hard: int, ceiling: int | None) -> list[tuple[int, int]]:
    """The (soft, hard) pairs to try, best first, for maxOpenFiles = `want`.

    First soft = hard = want (upstream's semantics, clamped to the kernel's ceiling);
    then, for a process that may not raise its hard limit, the soft limit raised as far
    as the hard one allows. Empty when nothing is to be done (`want` <= 0, or already
    exactly in place).
    """
    if want <= 0:
        return []
    target = min(want, ceiling) if ceiling is not None and ceiling > 0 else want
    plans: list[tuple[int, int]] = []
    if (soft, hard) != (target, target):
        plans.append((target, target))
    fallback = target if _above(hard, target) else hard
    if fallback != soft and (fallback, hard) not in plans and not _above(soft, fallback):
        plans.append((fallback, hard))
    return plans


def apply_open_files_limit(
    want: int, *, limits: NofileLimits | None = None, field: str = "maxOpenFiles"
) -> NofileOutcome:
    """Set RLIMIT_NOFILE for maxOpenFiles = `want` as far as the kernel allows; log a
    WARNING naming `field` when the process is left below `want`."""
    io: NofileLimits = limits if limits is not None else ProcessNofileLimits()
    soft, hard = io.get()
    ceiling = io.ceiling()
    errors: list[str] = []
    for new_soft, new_hard in plan_open_files(want, soft, hard, ceiling):
        try:
            io.set(new_soft, new_hard)
        except OSError as err:
            errors.append(f"setting {new_soft}/{new_hard}: {err.strerror or err}")
            continue
        soft, hard = new_soft, new_hard
        break
    problem = ""
    if want > 0 and not _above(soft, want):
        why = []
        if ceiling is not None and ceiling < want:
            why.append(f"the kernel's fs.nr_open is {ceiling}")
        why += errors
        problem = "; ".join(why) or "not permitted"
        log.warning(
            "%s: cannot raise the open-files limit to %d; running with soft %d, hard %s (%s)",
            field,
            want,
            soft,
            "unlimited" if hard == UNLIMITED else hard,
            problem,
            extra={"field": field, "wanted": want, "soft": soft, "hard": hard},
        )
    elif want > 0:
        log.debug("open-files limit", extra={"soft": soft, "hard": hard})
    return NofileOutcome(wanted=want, soft=soft, hard=hard, problem=problem)

"""maxOpenFiles as RLIMIT_NOFILE (klet.cli.rlimits): the limits tried, best first, and
what a process ends up with as root, unprivileged (may not raise its hard limit) and
under a kernel ceiling (fs.nr_open), with a WARNING naming the field whenever the
process stays below the wish; and the shared entry sequence applying it before a
service's event loop starts."""

from __future__ import annotations

import errno
import logging

import pytest
from klet.cli import rlimits, service
from klet.cli.rlimits import (
    UNLIMITED,
    NofileLimits,
    apply_open_files_limit,
    plan_open_files,
)
from klet.config import Settings


class FakeKernel:
    """RLIMIT_NOFILE as Linux enforces it: soft <= hard <= nr_open, and raising the hard
    limit needs CAP_SYS_RESOURCE."""

    def __init__(
        self, soft: int, hard: int, *, nr_open: int | None = 1 << 20, privileged: bool = True
    ) -> None:
        self.soft, self.hard = soft, hard
        self.nr_open = nr_open
        self.privileged = privileged
        self.calls: list[tuple[int, int]] = []

    def get(self) -> tuple[int, int]:
        return self.soft, self.hard

    def set(self, soft: int, hard: int) -> None:
        self.calls.append((soft, hard))
        if soft > hard or (self.nr_open is not None and hard > self.nr_open):
            raise OSError(errno.EINVAL, "Invalid argument")
        if hard > self.hard and self.hard != UNLIMITED and not self.privileged:
            raise OSError(errno.EPERM, "Operation not permitted")
        self.soft, self.hard = soft, hard

    def ceiling(self) -> int | None:
        return self.nr_open


def _conforms(k: FakeKernel) -> NofileLimits:
    return k


@pytest.mark.parametrize(
    ("want", "soft", "hard", "ceiling", "plans"),
    [
        (0, 1024, 4096, None, []),
        (1_000_000, 1_000_000, 1_000_000, None, []),
        (1_000_000, 1024, 4096, None, [(1_000_000, 1_000_000), (4096, 4096)]),
        (1_000_000, 1024, UNLIMITED, None, [(1_000_000, 1_000_000), (1_000_000, UNLIMITED)]),
        (2_000_000, 1024, 4096, 1 << 20, [(1 << 20, 1 << 20), (4096, 4096)]),
        # Upstream's semantics: soft = hard = maxOpenFiles, lower too; the fallback never
        # lowers the soft limit.
        (5000, 20000, 20000, None, [(5000, 5000)]),
        (5000, 1024, 1_000_000, None, [(5000, 5000), (5000, 1_000_000)]),
    ],
)
def test_plan(want: int, soft: int, hard: int, ceiling: int | None, plans: list[object]) -> None:
    assert plan_open_files(want, soft, hard, ceiling) == plans


def test_root_gets_soft_and_hard(caplog: pytest.LogCaptureFixture) -> None:
    kernel = FakeKernel(1024, 4096)
    with caplog.at_level(logging.WARNING):
        outcome = apply_open_files_limit(1_000_000, limits=kernel)
    assert (kernel.soft, kernel.hard) == (1_000_000, 1_000_000)
    assert (outcome.soft, outcome.hard, outcome.problem) == (1_000_000, 1_000_000, "")
    assert not caplog.records


def test_unprivileged_raises_soft_to_hard_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    kernel = FakeKernel(1024, 4096, privileged=False)
    with caplog.at_level(logging.WARNING):
        outcome = apply_open_files_limit(1_000_000, limits=kernel)
    assert (kernel.soft, kernel.hard) == (4096, 4096)
    assert "Operation not permitted" in outcome.problem
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelname == "WARNING"
    assert message.startswith("maxOpenFiles: cannot raise the open-files limit to 1000000")
    assert "soft 4096, hard 4096" in message and "Operation not permitted" in message


def test_kernel_ceiling_is_named(caplog: pytest.LogCaptureFixture) -> None:
    kernel = FakeKernel(1024, 4096, nr_open=65536)
    with caplog.at_level(logging.WARNING):
        outcome = apply_open_files_limit(1_000_000, limits=kernel)
    assert kernel.calls == [(65536, 65536)]
    assert (outcome.soft, outcome.hard) == (65536, 65536)
    assert "fs.nr_open is 65536" in caplog.records[0].getMessage()


def test_nothing_to_do() -> None:
    kernel = FakeKernel(4096, 4096)
    assert apply_open_files_limit(4096, limits=kernel).problem == ""
    assert apply_open_files_limit(0, limits=kernel).problem == ""
    assert kernel.calls == []


def test_every_service_applies_max_open_files(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[int] = []
    monkeypatch.setattr(service, "apply_open_files_limit", lambda want, **_: applied.append(want))
    monkeypatch.setattr(service, "configure_logging", lambda **_: None)
    monkeypatch.setattr(service, "apply_oom_score_adj", lambda value: "")
    monkeypatch.setattr(service, "swap_problem", lambda fail_swap_on: None)

    async def start(settings: Settings) -> int:
        assert applied == [4096], "the limit must be in place before the service starts"
        return 0

    assert service.run_service("status-reporter", ["--max-open-files", "4096"], start) == 0
    assert applied == [4096]
    assert rlimits.ProcessNofileLimits().get()  # the real reader works on this host

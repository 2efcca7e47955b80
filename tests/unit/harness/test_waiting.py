"""wait_for: it returns the first truthy value, retries transient errors until the
timeout, and lets an error that is a bug (in the check or the code under test) through at
once instead of polling it for the whole timeout."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest
from klet.bus import BusUnavailable

from tests.harness.waiting import wait_for


def sequence(*outcomes: object) -> tuple[Callable[[], object], list[int]]:
    """A check that yields `outcomes` in turn (raising the exceptions), and its call count."""
    items: Iterator[object] = iter(outcomes)
    calls = [0]

    def check() -> object:
        calls[0] += 1
        item = next(items)
        if isinstance(item, BaseException):
            raise item
        return item

    return check, calls


def test_returns_the_first_truthy_value() -> None:
    check, calls = sequence(None, 0, "", {"phase": "Running"})
    assert wait_for(check, timeout_s=5, what="x", interval_s=0) == {"phase": "Running"}
    assert calls[0] == 4


@pytest.mark.parametrize(
    "transient",
    [
        ConnectionRefusedError(111, "refused"),
        KeyError("web-node1"),
        IndexError("list index out of range"),
        StopIteration(),
        ValueError("Expecting value"),
        subprocess.CalledProcessError(1, ["kubectl", "get"], stderr="NotFound"),
        BusUnavailable("redis down"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_errors_are_retried(transient: BaseException) -> None:
    check, calls = sequence(transient, transient, "ok")
    assert wait_for(check, timeout_s=5, what="x", interval_s=0) == "ok"
    assert calls[0] == 3


@pytest.mark.parametrize(
    "bug",
    [
        AssertionError("probe asserted"),
        TypeError("'NoneType' object is not subscriptable"),
        AttributeError("'NoneType' object has no attribute 'group'"),
        NameError("name 'pdo' is not defined"),
        ZeroDivisionError("division by zero"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_bug_fails_at_once(bug: BaseException) -> None:
    check, calls = sequence(bug, "never reached")
    with pytest.raises(type(bug)) as raised:
        wait_for(check, timeout_s=60, what="x", interval_s=0)
    assert raised.value is bug
    assert calls[0] == 1


def test_timeout_names_what_and_the_last_value() -> None:
    check, _ = sequence(False)
    with pytest.raises(
        AssertionError, match=r"timed out after 0s waiting for web Running; last: False"
    ):
        wait_for(check, timeout_s=0, what="web Running", interval_s=0)


def test_timeout_names_the_last_transient_error_with_a_command_s_stderr() -> None:
    failed = subprocess.CalledProcessError(1, ["kubectl"], stderr='leases "n1" not found\n')
    check, _ = sequence(failed)
    with pytest.raises(AssertionError) as raised:
        wait_for(check, timeout_s=0, what="a Lease", interval_s=0)
    message = str(raised.value)
    assert "waiting for a Lease" in message
    assert "CalledProcessError" in message and 'leases "n1" not found' in message

"""Waiting on observable conditions: `wait_for` polls a check until it holds.

A check may fail while the thing it looks at is not there yet: the service's port
refuses connections, `/pods` does not list the pod, a kubectl get of a Lease exits
non-zero, the bus is down for a moment. Those are `TRANSIENT` and retried until the
timeout. Any other exception (an AssertionError, TypeError, AttributeError, NameError,
...) is a bug in the check or in the code under test, and polling it for the whole timeout
would only hide it behind a "timed out": it propagates at once.

KeyError and IndexError stay transient: `node.pods()[name]` is how a check says "not
listed yet", and a mistyped key cannot be told from it; the timeout message carries the
last error, which names the key.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

from klet.bus import BusUnavailable
from klet.cri.errors import CRIError
from klet.kube.errors import NotFound, Unavailable
from klet.rpc.podcontrol import RpcUnavailable

T = TypeVar("T")

TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,  # connection refused or reset, HTTP errors (urllib), a file not written yet
    LookupError,  # KeyError, IndexError: not listed yet
    StopIteration,  # next() over what is not listed yet (container_status)
    ValueError,  # a body or file not complete yet (JSONDecodeError), BadRecord
    subprocess.CalledProcessError,  # a command (kubectl, crictl) that failed this time
    BusUnavailable,
    CRIError,
    NotFound,
    Unavailable,
    RpcUnavailable,
)


def describe(err: BaseException) -> str:
    """The error as the timeout message shows it; a failed command with its stderr."""
    if isinstance(err, subprocess.CalledProcessError) and err.stderr:
        return f"{err!r}: {str(err.stderr).strip()}"
    return repr(err)


def wait_for(
    check: Callable[[], T | None], *, timeout_s: float, what: str, interval_s: float = 0.25
) -> T:
    """Poll until `check` returns something truthy and return it; fail naming `what` and
    the last value or transient error. A non-transient error propagates at once."""
    deadline = time.monotonic() + timeout_s
    last: str = "nothing yet"
    while True:
        try:
            value = check()
            if value:
                return value
            last = repr(value)
        except TRANSIENT as err:
            last = describe(err)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last}")
        time.sleep(interval_s)

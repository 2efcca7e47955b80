"""The one retry policy of klet's loops: tenacity, shaped by a `BackoffPolicy`.

A loop that must keep calling a dependency until it answers (the bus during a Redis
outage, the apiserver) or that retries one call a bounded number of times calls it
through `retrying(...)`. Each failure waits the policy's next delay — `initial_s`, doubled
per consecutive failure (from 1 ms when `initial_s` is 0, so a zero start still backs
off), at most `max_s` — and a success ends the attempt, so the next call starts over at
the initial delay: a loop resumes within `max_s` of its dependency's return. What a loop
does on a failure (log once, drop a cursor) is its `on_failure`; how it waits can be its
own `sleep` (an event that cuts the wait short).

Why one module: ten loops each wrote the same "sleep, double, cap, reset" by hand, each a
little differently; tests could not tell them apart and a fix reached one of them.
`tests/unit/test_retry.py` fails when a service writes such a loop again.

Upstream's container back-off (crash loop, image pull) is not a retry of a call but a
per-container domain rule with its own clock and expiry: it stays
`klet.model.flowcontrol.Backoff`. The single-call retries of the CRI reads and the
apiserver calls (`klet.cri.client`, status-reporter's `kubeapi`) use tenacity directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from klet.model.flowcontrol import BackoffPolicy
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_base,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_never,
)
from tenacity.wait import wait_base

T = TypeVar("T")

MIN_GROWTH_S = 0.001
"""The second delay when the first is 0, so a zero initial delay still backs off."""

OnFailure = Callable[[BaseException | None], None]
"""Told of each failed attempt that will be retried (or ends the attempts): its
exception, or None when the call returned a result that asks for a retry."""

BeforeWait = Callable[[BaseException | None, float], None]
"""Told, before each wait, of the failure (as `OnFailure`) and how long the wait is."""


def delay_after(policy: BackoffPolicy, failures: int) -> float:
    """The wait after the `failures`-th consecutive failure (1 = the first)."""
    if failures < 1:
        raise ValueError(f"delay_after: failures must be >= 1, got {failures}")
    delay = policy.initial_s
    for _ in range(failures - 1):
        grown = min(max(delay * 2, MIN_GROWTH_S), policy.max_s)
        if grown == delay:
            break  # at the cap: it stays there
        delay = grown
    return delay


class wait_policy(wait_base):  # noqa: N801 - named like tenacity's own wait_* strategies
    """tenacity's wait strategy for a `BackoffPolicy` (see `delay_after`), continuing a
    back-off already `after_failures` failures deep."""

    def __init__(self, policy: BackoffPolicy, *, after_failures: int = 0) -> None:
        self.policy = policy
        self.after_failures = after_failures

    def __call__(self, retry_state: RetryCallState) -> float:
        return delay_after(self.policy, self.after_failures + retry_state.attempt_number)


def retrying(
    policy: BackoffPolicy,
    *,
    on: type[BaseException] | tuple[type[BaseException], ...] = (),
    retry_result: Callable[[Any], bool] | None = None,
    attempts: int | None = None,
    on_failure: OnFailure | None = None,
    before_wait: BeforeWait | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    after_failures: int = 0,
) -> AsyncRetrying:
    """A tenacity `AsyncRetrying` that retries a call raising one of `on` (or returning
    a result for which `retry_result` is true), waiting `policy`'s delays.

    Without `attempts` it retries until the call succeeds; with it, it makes at most
    that many attempts (at least one) and then raises the last exception as it was (or
    returns the last result). Any other exception, and a cancellation, goes to the
    caller at once. `after_failures` continues a back-off that many failures deep (the
    first wait is the policy's `after_failures + 1`-th). `call_retrying` runs one call
    through it, typed (use that: `AsyncRetrying` awaits only what a coroutine function
    returns).
    """
    retry: retry_base = retry_if_exception_type(on)
    if retry_result is not None:
        retry = retry | retry_if_result(retry_result)

    def after(state: RetryCallState) -> None:
        if on_failure is not None and state.outcome is not None:
            on_failure(_failure(state))

    def before_sleep(state: RetryCallState) -> None:
        if before_wait is not None:
            before_wait(_failure(state), state.upcoming_sleep)

    return AsyncRetrying(
        retry=retry,
        wait=wait_policy(policy, after_failures=after_failures),
        stop=stop_never if attempts is None else stop_after_attempt(max(1, attempts)),
        after=after,
        before_sleep=before_sleep,
        sleep=sleep if sleep is not None else asyncio.sleep,
        retry_error_callback=_last_outcome,
        reraise=True,
    )


async def call_retrying(
    call: Callable[[], Awaitable[T]],
    policy: BackoffPolicy,
    *,
    on: type[BaseException] | tuple[type[BaseException], ...] = (),
    retry_result: Callable[[T], bool] | None = None,
    attempts: int | None = None,
    on_failure: OnFailure | None = None,
    before_wait: BeforeWait | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    after_failures: int = 0,
) -> T:
    """`call()` through `retrying(policy, ...)`: its result once it succeeds."""
    policy_run = retrying(
        policy,
        on=on,
        retry_result=retry_result,
        attempts=attempts,
        on_failure=on_failure,
        before_wait=before_wait,
        sleep=sleep,
        after_failures=after_failures,
    )

    async def attempt() -> T:
        # A coroutine function: tenacity would call a plain callable (a lambda returning
        # an awaitable) without awaiting what it returns.
        return await call()

    result: T = await policy_run(attempt)
    return result


def _failure(state: RetryCallState) -> BaseException | None:
    outcome = state.outcome
    return outcome.exception() if outcome is not None and outcome.failed else None


def _last_outcome(state: RetryCallState) -> Any:
    """When bounded attempts run out: raise the last exception as it was, or return the
    last result (tenacity's `reraise` would try to raise a result)."""
    assert state.outcome is not None
    return state.outcome.result()

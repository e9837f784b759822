"""The project's one way of trying again: tenacity's `AsyncRetrying`, built here.

Every loop that repeats an operation until it works uses these builders, each with its own
limits and delays:

- data reads (`psyche_common.data.retry`): `RetryPolicy`'s linear steps (0, 2, 4, … 12 s over
  7 attempts by default), transient errors only;
- the client's model load and result downloads: delays that double (`doubling`), capped;
- a P2P fetch's rounds over its candidate peers: doubling delays between rounds;
- manifest polls (a joiner's model download, the Warmup weights check): `polling`, a fixed
  interval within a time budget, until the answer is good enough;
- the server reconnect: jittered doubling delays until its give-up time.

So the mechanics (when to stop, how long to wait, which failures are retried, what is logged
before a wait) are written once, by a library that is mature, asyncio-native and composes its
stop and wait rules. A cancellation (`asyncio.CancelledError`) is never retried.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_fixed,
    wait_incrementing,
)
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

T = TypeVar("T")

Callback = Callable[[RetryCallState], Awaitable[None] | None]
"""Called with tenacity's state of the attempt that just failed."""


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries; the wait before attempt k (1-based) is ``delay_step * (k - 1)`` s."""

    attempts: int = 7
    delay_step: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.delay_step < 0:
            raise ValueError(f"RetryPolicy.delay_step must be >= 0, got {self.delay_step}")

    def delay_before(self, attempt: int) -> float:
        return self.delay_step * (attempt - 1)


def linear(step: float) -> wait_base:
    """`step`, `2 * step`, `3 * step`, ... after the 1st, 2nd, 3rd failed attempt."""
    return wait_incrementing(start=step, increment=step)


def doubling(first: float, cap: float = math.inf) -> wait_base:
    """`first`, `2 * first`, `4 * first`, ... after each failed attempt, at most `cap`."""
    return wait_exponential(multiplier=first, exp_base=2, min=0, max=cap)


def retry_on(predicate: Callable[[Exception], bool]) -> retry_base:
    """Retry the exceptions `predicate` accepts (never a cancellation or other
    `BaseException`)."""
    return retry_if_exception(lambda exc: isinstance(exc, Exception) and predicate(exc))


def retrying(
    *,
    wait: wait_base | Callable[[RetryCallState], float],
    retry: retry_base,
    attempts: int | None = None,
    stop: stop_base | Callable[[RetryCallState], bool] | None = None,
    after: Callback | None = None,
    before_sleep: Callback | None = None,
    on_give_up: Callable[[RetryCallState], Any] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> AsyncRetrying:
    """An `AsyncRetrying` that stops after `attempts` (none: only by `stop`, else never), waits
    `wait` between attempts and retries what `retry` accepts. `after` runs after every failed
    attempt that `retry` accepts (the last too), `before_sleep` before each wait. When the
    attempts run out, `on_give_up(state)` decides (raise or return); without it the last error
    is raised as it was."""
    stops: stop_base | Callable[[RetryCallState], bool] = stop_never
    if attempts is not None:
        stops = stop_after_attempt(attempts)
        if stop is not None:
            stops = stops | stop  # type: ignore[operator]
    elif stop is not None:
        stops = stop
    options: dict[str, Any] = {}
    if sleep is not None:
        options["sleep"] = sleep
    if after is not None:
        options["after"] = after
    return AsyncRetrying(
        stop=stops,
        wait=wait,
        retry=retry,
        before_sleep=before_sleep,
        retry_error_callback=on_give_up,
        reraise=True,
        **options,
    )


def polling(done: Callable[[Any], bool], interval: float, within: float) -> AsyncRetrying:
    """Call again every `interval` seconds until `done(result)` or `within` seconds have passed
    since the first call; the last result is returned either way (at least one call)."""
    return AsyncRetrying(
        stop=stop_after_delay(within),
        wait=wait_fixed(interval),
        retry=retry_if_result(lambda result: not done(result)),
        retry_error_callback=last_result,
    )


async def call(retrying: AsyncRetrying, operation: Callable[[], Awaitable[T]]) -> T:
    """Await `operation()` under `retrying`: its first result that `retrying` takes (with
    `polling`, the last one when time ran out), or the error that ended the retrying."""
    async for attempt in retrying:
        with attempt:
            result = await operation()
        outcome = attempt.retry_state.outcome
        if outcome is not None and not outcome.failed:
            attempt.retry_state.set_result(result)  # what a result-based `retry` looks at
    return result


def last_result(state: RetryCallState) -> Any:
    """The result (or the error, raised) of the attempt that ended the retrying."""
    assert state.outcome is not None
    return state.outcome.result()


def failure(state: RetryCallState) -> BaseException:
    """The error of the attempt that just failed."""
    assert state.outcome is not None
    error = state.outcome.exception()
    assert error is not None
    return error

"""psyche_common.retry: the builders keep the delays, limits and errors the loops had."""

from __future__ import annotations

import asyncio

import pytest
from psyche_common.retry import call, doubling, linear, polling, retry_on, retrying
from tenacity import RetryCallState


def delays(strategy: object, failures: int) -> list[float]:
    waits = []
    for number in range(1, failures + 1):
        state = RetryCallState(None, None, (), {})
        state.attempt_number = number
        waits.append(strategy(state))  # type: ignore[operator]
    return waits


def test_linear_and_doubling_delays() -> None:
    assert delays(linear(2.0), 6) == [2, 4, 6, 8, 10, 12]  # RetryPolicy's 0, 2, ... 12 s
    assert delays(doubling(2.0, 16.0), 5) == [2, 4, 8, 16, 16]
    assert delays(doubling(0.2), 3) == pytest.approx([0.2, 0.4, 0.8])


async def test_attempts_errors_and_cancellation() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("down")
        return "ok"

    policy = retrying(
        wait=doubling(1.0),
        retry=retry_on(lambda e: isinstance(e, OSError)),
        attempts=3,
        sleep=sleep,
    )
    assert await call(policy, flaky) == "ok" and sleeps == [1.0, 2.0]

    async def always_down() -> str:
        raise OSError("still down")

    policy = retrying(wait=linear(0), retry=retry_on(lambda e: True), attempts=2, sleep=sleep)
    with pytest.raises(OSError, match="still down"):  # the last error, as it was
        await call(policy, always_down)

    async def permanent() -> str:
        calls.append(1)
        raise ValueError("bad")

    calls.clear()
    policy = retrying(
        wait=linear(0), retry=retry_on(lambda e: isinstance(e, OSError)), attempts=5, sleep=sleep
    )
    with pytest.raises(ValueError):
        await call(policy, permanent)
    assert len(calls) == 1

    async def cancelled() -> str:
        calls.append(1)
        raise asyncio.CancelledError

    calls.clear()
    policy = retrying(wait=linear(0), retry=retry_on(lambda e: True), attempts=5, sleep=sleep)
    with pytest.raises(asyncio.CancelledError):
        await call(policy, cancelled)
    assert len(calls) == 1


async def test_polling_returns_the_first_good_or_the_last_answer() -> None:
    answers = iter(range(10))

    async def ask() -> int:
        return next(answers)

    assert await call(polling(lambda n: n >= 2, 0.0, 10.0), ask) == 2
    assert await call(polling(lambda n: n > 100, 0.01, 0.0), ask) == 3  # one call, time is up

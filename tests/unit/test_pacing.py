"""`BytePacer`: the long-run rate holds, the burst passes at once, concurrent senders share."""

from __future__ import annotations

import asyncio

import pytest
from psyche_common.pacing import MEGABIT, BytePacer


class FakeTime:
    """A clock that only moves when a pacer sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_the_burst_goes_at_once_and_the_rest_at_the_rate() -> None:
    t = FakeTime()
    pacer = BytePacer(1000.0, burst=500, clock=t.clock, sleep=t.sleep)
    await pacer.take(500)
    assert t.sleeps == []
    await pacer.take(1000)
    assert t.sleeps == [pytest.approx(1.0)]
    await pacer.take(250)
    assert t.now == pytest.approx(1.25)
    assert pacer.waited == pytest.approx(1.25)


async def test_idle_time_refills_only_up_to_the_burst() -> None:
    t = FakeTime()
    pacer = BytePacer(100.0, burst=100, clock=t.clock, sleep=t.sleep)
    t.now = 1000.0  # a long pause earns no more than the burst
    await pacer.take(300)
    assert t.sleeps == [pytest.approx(2.0)]


async def test_concurrent_senders_share_the_rate() -> None:
    pacer = BytePacer(200_000.0, burst=0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(pacer.take(20_000) for _ in range(5)))  # 100 kB at 200 kB/s
    assert loop.time() - started >= 0.45


async def test_an_unpaced_pacer_never_waits() -> None:
    t = FakeTime()
    pacer = BytePacer.from_mbps(0, burst=0)
    await pacer.take(10**9)
    assert pacer.bytes_per_second is None and t.sleeps == []
    assert BytePacer.from_mbps(8).bytes_per_second == pytest.approx(8 * MEGABIT)


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="bytes_per_second must be positive"):
        BytePacer(0.0)
    with pytest.raises(ValueError, match="burst must be at least 0"):
        BytePacer(1.0, burst=-1)

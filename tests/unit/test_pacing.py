"""`BytePacer`: the long-run rate holds, the burst passes at once, concurrent senders share."""

from __future__ import annotations

import asyncio

import pytest
from psyche_common.pacing import MEGABIT, BytePacer, FairBytePacer


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


async def test_a_key_with_many_streams_gets_no_more_than_its_share() -> None:
    """`FairBytePacer`: a hog running 8 streams and an honest client running 1 take turns,
    so the honest transfers are not queued behind all of the hog's."""
    t = FakeTime()

    async def sleep(seconds: float) -> None:
        await t.sleep(seconds)
        await asyncio.sleep(0)  # let the other senders queue, as a real sleep would

    pacer = FairBytePacer(BytePacer(1000.0, burst=0, clock=t.clock, sleep=sleep))
    order: list[bytes] = []

    async def send(key: bytes, chunks: int) -> None:
        for _ in range(chunks):
            await pacer.take(key, 100)
            order.append(key)

    hog = [send(b"hog", 4) for _ in range(8)]
    await asyncio.gather(*hog, send(b"honest", 4))
    honest_at = [i for i, key in enumerate(order) if key == b"honest"]
    # round-robin per key: the honest client's chunks are every other one while both wait
    # (without turns they would come after the hog's 32)
    assert honest_at == [2, 4, 6, 8]
    assert t.now == pytest.approx(3.6)  # the aggregate rate still holds: 36 chunks of 100 B
    assert pacer.waited == pytest.approx(3.6)


async def test_a_cancelled_waiter_hands_the_turn_on() -> None:
    pacer = FairBytePacer(BytePacer(100_000.0, burst=0))
    first = asyncio.ensure_future(pacer.take(b"a", 10_000))  # holds the turn for 0.1 s
    second = asyncio.ensure_future(pacer.take(b"b", 1_000))
    third = asyncio.ensure_future(pacer.take(b"c", 1_000))
    await asyncio.sleep(0.01)
    second.cancel()
    await asyncio.wait_for(asyncio.gather(first, third), timeout=2)
    assert second.cancelled()
    await asyncio.wait_for(pacer.take(b"a", 10), timeout=2)  # free again

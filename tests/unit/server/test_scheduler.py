"""The tick scheduler on its own: message bursts coalesce into one tick, spaced in time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from psyche_server.options import ServerStats
from psyche_server.scheduler import TickScheduler

from tests.support.server_harness import load_coordinator, write_state


def make_scheduler(
    tmp_path: Path, ticks: list[str], per_second: float, interval: float = 0.5
) -> TickScheduler:
    coordinator = load_coordinator(write_state(tmp_path / "s.toml"))
    return TickScheduler(
        coordinator,
        clock=lambda: 1000.0,  # WaitingForMembers's deadline long past: no early tick
        tick_interval=interval,
        max_message_ticks_per_second=per_second,
        stats=ServerStats(),
        grid_tick=lambda: ticks.append("grid"),
        extra_tick=lambda: ticks.append("extra"),
    )


async def test_a_burst_of_messages_costs_one_tick(tmp_path: Path) -> None:
    ticks: list[str] = []
    scheduler = make_scheduler(tmp_path, ticks, per_second=1000)
    for _ in range(5):
        scheduler.message_arrived()
        scheduler.schedule_message_tick()
    await asyncio.sleep(0.01)
    assert ticks == ["extra"]
    assert scheduler.stats.message_ticks == 1


async def test_message_ticks_are_spaced_by_the_rate_limit(tmp_path: Path) -> None:
    ticks: list[str] = []
    scheduler = make_scheduler(tmp_path, ticks, per_second=2)  # one per 0.5 s at most
    loop = asyncio.get_running_loop()
    scheduler.schedule_message_tick()
    await asyncio.sleep(0.01)
    assert ticks == ["extra"]
    first = loop.time()
    scheduler.schedule_message_tick()  # the next burst waits for the spacing
    while len(ticks) < 2 and loop.time() < first + 5:
        await asyncio.sleep(0.01)
    assert ticks == ["extra", "extra"]
    assert loop.time() - first >= 0.45


async def test_cancel_drops_a_scheduled_message_tick(tmp_path: Path) -> None:
    ticks: list[str] = []
    scheduler = make_scheduler(tmp_path, ticks, per_second=1000)
    scheduler.schedule_message_tick()
    scheduler.cancel()
    await asyncio.sleep(0.01)
    assert ticks == []


async def test_run_ticks_on_the_grid_until_stopped(tmp_path: Path) -> None:
    ticks: list[str] = []
    scheduler = make_scheduler(tmp_path, ticks, per_second=1000, interval=0.2)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    task = asyncio.ensure_future(scheduler.run(stop))
    began = loop.time()
    while len(ticks) < 2 and loop.time() < began + 5:
        await asyncio.sleep(0.01)
    assert loop.time() - began >= 0.15  # the second grid tick waited for the interval
    stop.set()
    await asyncio.wait_for(task, 1)
    assert set(ticks) == {"grid"}

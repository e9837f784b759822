"""When the server ticks: the grid, the early tick at each state's deadline, and message ticks.

`TickScheduler` decides only *when*; what a tick does (kick, tick the coordinator, save,
broadcast) is the app's, passed in as callables. The grid ticks every `tick_interval` seconds
(missed ticks are skipped); between two grid ticks one extra tick runs at the moment the current
state's timeout can first fire (`state_timeout_deadline`); and a burst of client messages costs
one tick, spaced at least `1 / max_message_ticks_per_second` apart.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from psyche_common.config import seconds_to_ms
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.types import RunState

from .options import ServerStats

TIMEOUT_TICK_MARGIN = 0.002
"""Seconds after a state's deadline that the extra tick runs (clock jitter)."""


def state_timeout_deadline(coordinator: Coordinator) -> float | None:
    """The first moment (unix seconds, millisecond resolution) at which the current state's
    `check_timeout` can pass: its start plus its duration, and never its start itself."""
    config = coordinator.config
    durations = {
        RunState.WaitingForMembers: config.waiting_for_members_extra_time,
        RunState.Warmup: config.warmup_time,
        RunState.RoundTrain: config.max_round_train_time,
        RunState.RoundWitness: config.round_witness_time,
        RunState.Cooldown: config.cooldown_time,
    }
    duration = durations.get(coordinator.run_state)
    if duration is None:
        return None
    return (coordinator.run_state_start_ms + max(seconds_to_ms(duration), 1)) / 1000


class TickScheduler:
    """Runs the tick loop and the message ticks; the ticks themselves are passed in.

    `grid_tick` runs on the grid (it broadcasts); `extra_tick` runs at a state's deadline and
    after messages (it broadcasts only when the state changed)."""

    def __init__(
        self,
        coordinator: Coordinator,
        clock: Callable[[], float],
        tick_interval: float,
        max_message_ticks_per_second: float,
        stats: ServerStats,
        grid_tick: Callable[[], None],
        extra_tick: Callable[[], None],
    ) -> None:
        self.coordinator = coordinator
        self.clock = clock
        self.tick_interval = tick_interval
        self.max_message_ticks_per_second = max_message_ticks_per_second
        self.stats = stats
        self._grid_tick = grid_tick
        self._extra_tick = extra_tick
        self._state_changed = asyncio.Event()
        self._message_tick: asyncio.Handle | asyncio.TimerHandle | None = None
        self._last_message_tick = -math.inf
        self._message_tick_key: tuple[RunState, int] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every `tick_interval` seconds (missed ticks are skipped) until `stop` is set.

        Between two grid ticks the server also ticks at the moment the current state's timeout
        can first fire (`seconds_until_timeout`, re-read whenever the state changes), so a
        state ends as soon as the coordinator's integer-second rules allow instead of up to
        one interval later; such an extra tick broadcasts only when it changed the state."""
        interval = self.tick_interval
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while not stop.is_set():
            self._grid_tick()
            next_tick += interval
            if next_tick < loop.time():
                next_tick = loop.time() + interval  # skip missed ticks, no catch-up
            ticked_early_at: tuple[RunState, int] | None = None
            while not stop.is_set():
                self._state_changed.clear()
                remaining = next_tick - loop.time()
                if remaining <= 0:
                    break
                early = self.seconds_until_timeout()
                if early is None or early >= remaining or ticked_early_at == self.state_key():
                    await self._sleep(stop, remaining)  # at most one early tick per state
                elif not await self._sleep(stop, early):
                    ticked_early_at = self.state_key()
                    self._extra_tick()

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep until ``seconds`` pass, ``stop`` is set or the state changes; True unless the
        time simply passed."""
        waiters = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self._state_changed.wait()),
        ]
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
        return bool(done)

    def seconds_until_timeout(self) -> float | None:
        """Seconds until the current state's timeout can first pass `check_timeout` (a little
        after that unix second begins), or None when there is none ahead."""
        deadline = state_timeout_deadline(self.coordinator)
        if deadline is None:
            return None
        remaining = deadline + TIMEOUT_TICK_MARGIN - self.clock()
        return remaining if remaining > 0 else None

    def state_key(self) -> tuple[RunState, int]:
        return self.coordinator.run_state, self.coordinator.run_state_start_ms

    def note_state_change(self, before: tuple[RunState, int]) -> None:
        """Wake the tick loop when the state (or its start) changed, so it re-reads the
        state's timeout."""
        if self.state_key() != before:
            self._state_changed.set()

    # ------------------------------------------------------------------ message ticks

    def message_arrived(self) -> None:
        """A client message arrived: the state before the burst it starts is remembered."""
        if self._message_tick is None:
            self._message_tick_key = self.state_key()

    def schedule_message_tick(self) -> None:
        """Tick once after the messages that are ready now (a burst of N messages, from one
        key or many, costs one tick and at most one broadcast, not N), and never sooner than
        `1 / max_message_ticks_per_second` after the previous message tick: however many
        keys send, messages cannot drive ticks faster than that."""
        if self._message_tick is not None:
            return
        loop = asyncio.get_running_loop()
        spacing = 1.0 / self.max_message_ticks_per_second
        wait = self._last_message_tick + spacing - loop.time()
        if wait > 0:
            self._message_tick = loop.call_later(wait, self._tick_after_messages)
        else:
            self._message_tick = loop.call_soon(self._tick_after_messages)

    def _tick_after_messages(self) -> None:
        self._message_tick = None
        self._last_message_tick = asyncio.get_running_loop().time()
        key = self._message_tick_key or self.state_key()
        self._message_tick_key = None
        self.stats.message_ticks += 1
        self._extra_tick()
        self.note_state_change(key)

    def cancel(self) -> None:
        """Drop a message tick still scheduled (the server is closing)."""
        if self._message_tick is not None:
            self._message_tick.cancel()
            self._message_tick = None

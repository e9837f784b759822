"""`BytePacer`: an asyncio token bucket that paces byte transfers to a rate.

`await pacer.take(n)` returns once sending `n` more bytes keeps the long-run rate at or under
`bytes_per_second` (after an initial `burst`). Concurrent callers share the rate: each takes
its bytes from one balance and waits until that balance is paid back, so a second sender waits
behind the first and the aggregate stays at the rate. A pacer without a rate never waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

MEGABIT = 1_000_000 / 8
"""Bytes per second in one Mbit/s (flags in Mbit/s are decimal, like link speeds)."""


class BytePacer:
    """Paces byte transfers to `bytes_per_second` (None: unpaced), allowing a `burst`."""

    def __init__(
        self,
        bytes_per_second: float | None,
        *,
        burst: int = 256 * 1024,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive or None, got {bytes_per_second}")
        if burst < 0:
            raise ValueError(f"burst must be at least 0, got {burst}")
        self.bytes_per_second = bytes_per_second
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._balance = float(burst)
        self._last = clock()
        self.waited = 0.0
        """Seconds callers spent waiting in total (how much the pace held transfers back)."""

    @classmethod
    def from_mbps(cls, mbps: float | None, *, burst: int = 256 * 1024) -> BytePacer:
        """A pacer for a rate in Mbit/s (None or 0: unpaced)."""
        return cls(None if not mbps else mbps * MEGABIT, burst=burst)

    async def take(self, size: int) -> None:
        """Wait until `size` more bytes may go (at once when unpaced or within the burst)."""
        rate = self.bytes_per_second
        if rate is None or size <= 0:
            return
        now = self._clock()
        self._balance = min(float(self.burst), self._balance + (now - self._last) * rate)
        self._last = now
        self._balance -= size
        if self._balance < 0:
            wait = -self._balance / rate
            self.waited += wait
            await self._sleep(wait)

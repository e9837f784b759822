"""`BytePacer`: an asyncio token bucket that paces byte transfers to a rate.

`await pacer.take(n)` returns once sending `n` more bytes keeps the long-run rate at or under
`bytes_per_second` (after an initial `burst`). Concurrent callers share the rate: each takes
its bytes from one balance and waits until that balance is paid back, so a second sender waits
behind the first and the aggregate stays at the rate. A pacer without a rate never waits.

`FairBytePacer` shares one `BytePacer` among senders named by key (the relay's clients) in
round-robin turns, so each key waiting gets an equal share of the transfers whatever number
of streams it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
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


class FairBytePacer:
    """A `BytePacer` shared by many senders in turns: while several keys wait, each one's
    next transfer goes in round-robin order (fair queueing per key), so one sender with many
    streams cannot take more than its share of the rate from the others. Transfers of one key
    keep their order; a pacer without a rate never waits."""

    def __init__(self, pacer: BytePacer) -> None:
        self.pacer = pacer
        self._waiting: OrderedDict[bytes, deque[asyncio.Future[None]]] = OrderedDict()
        self._busy = False

    @classmethod
    def from_mbps(cls, mbps: float | None, *, burst: int = 256 * 1024) -> FairBytePacer:
        return cls(BytePacer.from_mbps(mbps, burst=burst))

    @property
    def waited(self) -> float:
        return self.pacer.waited

    async def take(self, key: bytes, size: int) -> None:
        """Wait for `key`'s turn, then until `size` more bytes may go."""
        if self.pacer.bytes_per_second is None or size <= 0:
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(turn)
        if not self._busy:
            self._busy = True
            self._pass_turn()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._pass_turn()  # the turn was ours: hand it on
            raise
        try:
            await self.pacer.take(size)
        finally:
            self._pass_turn()

    def _pass_turn(self) -> None:
        """Give the turn to the first key with a waiter and move that key last (it stays, even
        with no waiter left, so a sender that queues its next transfer right after its turn
        keeps its place); keys met first with no waiter are dropped. No waiter: the pacer
        is free."""
        while self._waiting:
            key, queue = next(iter(self._waiting.items()))
            while queue and queue[0].done():  # cancelled waiters
                queue.popleft()
            if not queue:
                del self._waiting[key]
                continue
            queue.popleft().set_result(None)
            self._waiting.move_to_end(key)
            return
        self._busy = False

"""Pacing a node's uploads: the current round's traffic before model shares, and an optional
cap on the rate at which model shares are uploaded.

Every frame a node writes is *urgent* (announcements, blob requests and answers, pings: the
current round's results) or *bulk* (the answers to `GetParameter` / `GetManifest`: the model
served to late joiners). Three mechanisms keep bulk frames from delaying urgent ones:

* `PriorityLock`, a link's writer lock: when it is released, a waiting urgent frame is
  written before any waiting bulk frame (first come, first served within each class).
* `UploadShaper`, one per node, shared by all its links: before a bulk frame is written it
  yields to blob answers being served on any link (for at most `max_yield` seconds per
  frame, so a model share always progresses), then takes its bytes from a token bucket of
  `rate` bytes/s (`psyche_common.pacing.BytePacer`) (`--max-upload-mbps`; None: no cap). Bulk chunks are at most
  `MAX_BULK_CHUNK` bytes, and with a cap at most `BULK_SLICE` seconds of it, so every bulk
  stream being served gets a frame well within the requester's read timeout.
* `limit_unsent(writer)`: the kernel keeps at most `UNSENT_LOW_WATER` unsent bytes per P2P
  socket (`TCP_NOTSENT_LOWAT`, where the platform has it); the rest waits in user space,
  where the two mechanisms above can still reorder it. Otherwise megabytes of parameter
  chunks could sit in the socket buffer ahead of a result on a slow link.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

from psyche_common.pacing import BytePacer

BULK_SLICE = 0.2
"""Seconds of the upload cap one bulk chunk may take (chunks are never cut below
`MIN_BULK_CHUNK`)."""
MIN_BULK_CHUNK = 16 * 1024
MAX_BULK_CHUNK = 64 * 1024
"""Bulk chunks are at most this long: a result waits for at most one of them (0.1 s at
5 Mbit/s) where a regular 256 KiB chunk would take 0.4 s."""
UNSENT_LOW_WATER = 64 * 1024
"""Unsent bytes the kernel may hold per P2P socket (`TCP_NOTSENT_LOWAT`)."""
TCP_NOTSENT_LOWAT: int | None = getattr(socket, "TCP_NOTSENT_LOWAT", None)
"""The socket option, where this platform's Python defines it (Linux does)."""


class PriorityLock:
    """A lock whose waiting urgent holders go before its waiting bulk ones."""

    def __init__(self) -> None:
        self._locked = False
        self._urgent: collections.deque[asyncio.Future[None]] = collections.deque()
        self._bulk: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def locked(self) -> bool:
        return self._locked

    @contextlib.asynccontextmanager
    async def hold(self, *, bulk: bool = False) -> AsyncIterator[None]:
        await self.acquire(bulk=bulk)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, *, bulk: bool = False) -> None:
        if not self._locked and not self._urgent and not self._bulk:
            self._locked = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._bulk if bulk else self._urgent
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the lock, then cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            raise

    def release(self) -> None:
        """Hand the lock to the next waiter (urgent ones first), or unlock it."""
        if not self._locked:
            raise RuntimeError("PriorityLock.release() of an unlocked lock")
        for queue in (self._urgent, self._bulk):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # stays locked: the waiter holds it now
                    return
        self._locked = False


class UploadShaper:
    """A node's bulk-upload gate: yields to urgent answers, then a token bucket (see the
    module docstring). `rate` is in bytes/s (None: no cap), `burst` in bytes."""

    def __init__(
        self,
        rate: float | None = None,
        *,
        burst: int | None = None,
        max_yield: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"upload rate must be positive, got {rate}")
        self.rate = rate
        self.burst = burst if burst is not None else (int(rate * BULK_SLICE) if rate else 0)
        self.max_yield = max_yield
        self._pacer = BytePacer(rate, burst=self.burst, clock=clock)
        self._urgent = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._turn = asyncio.Lock()  # bulk frames take tokens one after another, in order
        self.bulk_bytes = 0
        """Bulk bytes let through so far."""

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """Mark an urgent answer (a blob) as being served: bulk frames wait meanwhile."""
        self._urgent += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._urgent -= 1
            if self._urgent == 0:
                self._idle.set()

    @property
    def urgent_in_flight(self) -> int:
        return self._urgent

    def bulk_chunk(self, chunk_size: int) -> int:
        """Bytes per bulk chunk: `chunk_size` up to `MAX_BULK_CHUNK`, or `BULK_SLICE`
        seconds of the cap if less."""
        chunk = min(chunk_size, MAX_BULK_CHUNK)
        if self.rate is None:
            return chunk
        return max(MIN_BULK_CHUNK, min(chunk, int(self.rate * BULK_SLICE)))

    async def before_bulk(self, nbytes: int) -> None:
        """Wait until a bulk frame of `nbytes` may be written."""
        async with self._turn:
            if self._urgent:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.max_yield):
                        await self._idle.wait()
            await self._pacer.take(nbytes)
            self.bulk_bytes += nbytes


def limit_unsent(writer: asyncio.StreamWriter, low_water: int = UNSENT_LOW_WATER) -> bool:
    """Keep at most `low_water` unsent bytes in the kernel for this socket; False where the
    platform lacks `TCP_NOTSENT_LOWAT` (nothing changes then)."""
    sock = writer.get_extra_info("socket")
    if (
        TCP_NOTSENT_LOWAT is None
        or sock is None
        or sock.family not in (socket.AF_INET, socket.AF_INET6)
    ):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, low_water)
    except OSError:
        return False
    return True

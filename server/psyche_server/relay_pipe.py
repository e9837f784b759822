"""One relay pipe: bytes copied both ways between two clients' sockets, paced and counted.

Each end is told `RelayConnected{peer}` on its own encrypted link with the relay
(`SecureChannel`); after that the pipe copies raw bytes, which are the two clients' own
end-to-end encrypted P2P link: the relay can neither read nor alter them unnoticed.
Each direction reads what arrived (up to `CHUNK` bytes), waits for its sender's turn at the shared
`FairBytePacer` (round-robin per client key, so no key takes more than its share), writes it to the other end and waits for that end to drain (within `write_timeout`: a client
that stops reading ends the pipe instead of filling the server's memory). The pipe ends when
either end closes, on a socket error, after `idle_timeout` seconds without a byte either way,
or on `close()`; both sockets are then closed. `RelayStats` counts bytes per client.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from psyche_common.pacing import FairBytePacer
from psyche_common.protocol import SecureChannel

CHUNK = 64 * 1024

End = tuple[bytes, SecureChannel]
"""(client id, its encrypted link with the relay, whose socket the pipe then copies)."""


@dataclass
class RelayStats:
    """What the relay forwarded: bytes per client (sent into / received from the relay)."""

    sent: Counter[bytes] = field(default_factory=Counter)
    """Bytes each client sent through the relay (forwarded to its peers)."""
    received: Counter[bytes] = field(default_factory=Counter)
    """Bytes the relay delivered to each client."""
    pipes_total: int = 0
    refused: int = 0

    @property
    def forwarded(self) -> int:
        """Bytes forwarded in total (every byte counts once)."""
        return sum(self.sent.values())


class Pipe:
    """Copies bytes between two ends until either stops (`run`), or until `close()`."""

    def __init__(
        self,
        first: End,
        second: End,
        pacer: FairBytePacer,
        stats: RelayStats,
        *,
        idle_timeout: float,
        write_timeout: float = 30.0,
    ) -> None:
        self.ends = (first[0], second[0])
        self._first = first
        self._second = second
        self._pacer = pacer
        self._stats = stats
        self._idle_timeout = idle_timeout
        self._write_timeout = write_timeout
        self._last_byte = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.forwarded = 0

    async def run(self) -> None:
        """Tell both ends they are connected, then copy until the pipe ends."""
        (a, a_channel), (b, b_channel) = self._first, self._second
        a_channel.write({"type": "RelayConnected", "peer": b})
        b_channel.write({"type": "RelayConnected", "peer": a})
        self._task = asyncio.current_task()
        try:
            await self._copy_both_ways()
        except asyncio.CancelledError:
            if not self._closing:
                raise
        finally:
            for _, channel in (self._first, self._second):
                channel.abort()

    def close(self) -> None:
        """End the pipe (both sockets close)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
        else:
            for _, channel in (self._first, self._second):
                channel.abort()

    async def _copy_both_ways(self) -> None:
        """Both directions and the idle watchdog; the first of them to end ends the others
        (an end closed, a socket error, a write timeout or the idle timeout)."""
        tasks = [
            asyncio.ensure_future(self._copy(self._first, self._second)),
            asyncio.ensure_future(self._copy(self._second, self._first)),
            asyncio.ensure_future(self._watch_idle()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _copy(self, source: End, target: End) -> None:
        sender, reader = source[0], source[1].reader
        receiver, writer = target[0], target[1].writer
        while True:
            data = await reader.read(CHUNK)
            if not data:
                return
            await self._pacer.take(sender, len(data))
            writer.write(data)
            async with asyncio.timeout(self._write_timeout):
                await writer.drain()
            self._last_byte = time.monotonic()
            self.forwarded += len(data)
            self._stats.sent[sender] += len(data)
            self._stats.received[receiver] += len(data)

    async def _watch_idle(self) -> None:
        while True:
            idle = time.monotonic() - self._last_byte
            if idle >= self._idle_timeout:
                raise TimeoutError(f"no byte either way for {self._idle_timeout:g}s")
            await asyncio.sleep(self._idle_timeout - idle)

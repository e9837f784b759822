"""Connection limits of a listening port and the per-connection message rate limiter."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from psyche_common.protocol import DEFAULT_MAX_FRAME_SIZE


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on what one listening port accepts (`psyche-server run` sets some of them)."""

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    handshake_timeout: float = 10.0
    max_buffered_send_bytes: int = 32 * 1024 * 1024
    socket_send_buffer: int | None = None
    """SO_SNDBUF for accepted sockets (None: the kernel's default)."""
    max_connections: int = 4096
    """Open sockets (authenticated or still in their handshake) beyond which new ones are dropped."""
    messages_per_second: float = 100.0
    message_burst: int = 500
    """Token bucket per connection: a peer that sends faster than this is disconnected."""


class RateLimiter:
    """A token bucket: `allow()` is False once the peer exceeds `rate` messages/s beyond `burst`."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

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
    max_buffered_send_bytes: int = 8 * 1024 * 1024
    """Bytes queued for one connection beyond which it is dropped as not reading."""
    max_skipped_states: int = 40
    """A state broadcast is skipped for a connection with more than a quarter of
    `max_buffered_send_bytes` still queued (the next tick sends a newer one); a connection that
    misses this many states in a row is dropped as not reading."""
    socket_send_buffer: int | None = None
    """SO_SNDBUF for accepted sockets (None: the kernel's default)."""
    max_connections: int = 4096
    """Open sockets (authenticated or still in their handshake) beyond which new ones are dropped."""
    max_connections_per_ip: int = 32
    """Open sockets from one IP address beyond which its new ones are dropped."""
    pre_join_timeout: float = 10.0
    """Seconds an authenticated coordinator connection has to send a valid Join (it gets no
    state until then); the data-server port has no Join and ignores it."""
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

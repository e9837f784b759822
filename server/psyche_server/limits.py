"""Connection limits of a listening port, the per-key message rate limiter and flood guard.

One identity has at most one connection per port, so a connection's limits are its key's.
`FloodGuard` decides per message: accept it, drop it (the key is over its rate), or close
the connection (the key stayed over its rate for more than a burst's worth of messages).
"""

from __future__ import annotations

import enum
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
    max_handshakes_per_ip: int = 16
    """Sockets from one IP address still in their handshake (not authenticated yet) beyond
    which its new ones are dropped: unauthenticated work per host stays small."""
    pre_join_timeout: float = 10.0
    """Seconds an authenticated coordinator connection has to send a valid Join (it gets no
    state until then); the data-server port has no Join and ignores it."""
    messages_per_second: float = 100.0
    message_burst: int = 500
    """Token bucket per connection (so per key): messages beyond it are dropped, and a key
    that goes on sending over it for `message_burst` more messages in a row is disconnected."""
    idle_timeout: float | None = 300.0
    """Seconds a joined coordinator connection may send nothing before it is closed (None:
    never). Honest clients send a keepalive after 30 s of silence."""
    max_message_ticks_per_second: float = 20.0
    """Coordinator ticks run after client messages, at most this many per second whatever
    the number of keys (the 500 ms tick grid runs besides)."""


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


class Verdict(enum.Enum):
    ACCEPT = "accept"
    DROP = "drop"
    CLOSE = "close"


class FloodGuard:
    """Per-key flood control: a token bucket of `rate` messages/s and `burst` tokens; a
    message without a token is dropped, and once `tolerance` messages in a row were dropped
    the next one closes the connection (an accepted message ends the streak)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        tolerance: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bucket = RateLimiter(rate, burst, clock)
        self.tolerance = burst if tolerance is None else tolerance
        self.dropped_in_a_row = 0
        self.dropped = 0

    def check(self) -> Verdict:
        if self._bucket.allow():
            self.dropped_in_a_row = 0
            return Verdict.ACCEPT
        if self.dropped_in_a_row >= self.tolerance:
            return Verdict.CLOSE
        self.dropped_in_a_row += 1
        self.dropped += 1
        return Verdict.DROP

"""The per-connection token bucket."""

from __future__ import annotations

from psyche_server.connections import RateLimiter


def test_burst_then_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=10, burst=5, clock=lambda: now[0])
    assert all(limiter.allow() for _ in range(5))
    assert not limiter.allow()
    now[0] += 0.1  # one token back
    assert limiter.allow()
    assert not limiter.allow()
    now[0] += 100  # refills only up to the burst
    assert sum(limiter.allow() for _ in range(10)) == 5

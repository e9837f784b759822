"""`FloodGuard`: a key over its rate has its messages dropped, and is closed if it persists."""

from __future__ import annotations

from psyche_server.limits import FloodGuard, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_drops_then_close() -> None:
    clock = Clock()
    guard = FloodGuard(rate=2.0, burst=3, clock=clock)
    assert [guard.check() for _ in range(3)] == [Verdict.ACCEPT] * 3
    assert [guard.check() for _ in range(3)] == [Verdict.DROP] * 3  # tolerance = burst
    assert guard.check() == Verdict.CLOSE
    assert guard.dropped == 3


def test_an_accepted_message_ends_the_streak_of_drops() -> None:
    clock = Clock()
    guard = FloodGuard(rate=2.0, burst=2, tolerance=2, clock=clock)
    assert [guard.check() for _ in range(4)] == [Verdict.ACCEPT] * 2 + [Verdict.DROP] * 2
    clock.now += 0.5  # one token back
    assert guard.check() == Verdict.ACCEPT
    assert guard.dropped_in_a_row == 0
    assert [guard.check() for _ in range(2)] == [Verdict.DROP] * 2
    assert guard.check() == Verdict.CLOSE
    assert guard.dropped == 4


def test_a_key_within_its_rate_is_never_dropped() -> None:
    clock = Clock()
    guard = FloodGuard(rate=10.0, burst=1, clock=clock)
    for _ in range(1000):
        clock.now += 0.11
        assert guard.check() == Verdict.ACCEPT

"""Kill schedules: when to kill, and whom (pure; the orchestrator does the kills).

Random client kills: every `interval` seconds (the first one interval after the start) `count`
distinct victims are drawn from the allowed client numbers (1-based; empty = every client). The
random source is injectable so tests are deterministic.

The server is never a random victim; it is killed once, on request (`--kill-server-at`), and
restarted from its saved state. Without random client kills that happens `at` seconds after the
start. With them it happens at the first round of client kills due at or after `at`, just
before that round's victims are killed: a restarted client's first connection to the server is
not retried, so the server must not go away while a client restarted by the previous round may
still be starting up (it is not, when the interval is longer than a client takes to start and
connect: a few seconds); a round's victims are restarted once the server is back.
"""

from __future__ import annotations

import math
import random
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

KILL_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}


def check_kill_options(num_clients: int, count: int | None, allowed: Sequence[int]) -> None:
    """Raise ValueError naming the option at fault."""
    if num_clients < 1:
        raise ValueError(f"--num-clients must be at least 1, got {num_clients}")
    bad = [n for n in allowed if not 1 <= n <= num_clients]
    if bad:
        raise ValueError(
            f"--allowed-to-kill lists client(s) {bad} outside 1..{num_clients} (clients are 1-based)"
        )
    if count is None:
        return
    if count < 1:
        raise ValueError(f"--random-kill-num must be at least 1, got {count}")
    pool = len(set(allowed)) if allowed else num_clients
    if count > pool:
        raise ValueError(
            f"--random-kill-num {count} is more than the {pool} client(s) allowed to be killed"
        )


@dataclass
class KillScheduler:
    """Decides when the next kill is due and picks its victims."""

    num_clients: int
    count: int
    interval: float
    allowed: Sequence[int] = ()
    rng: random.Random = field(default_factory=random.Random)
    start: float = 0.0
    _next_due: float = field(init=False)

    def __post_init__(self) -> None:
        check_kill_options(self.num_clients, self.count, self.allowed)
        if self.interval <= 0:
            raise ValueError(f"--random-kill-interval must be positive, got {self.interval}")
        self._next_due = self.start + self.interval

    @property
    def candidates(self) -> list[int]:
        if self.allowed:
            return sorted(set(self.allowed))
        return list(range(1, self.num_clients + 1))

    def due(self, now: float) -> bool:
        return now >= self._next_due

    def take_victims(self, now: float) -> list[int]:
        """Victims of the kill due at `now` (empty when none is due); schedules the next one."""
        if not self.due(now):
            return []
        self._next_due = now + self.interval
        return sorted(self.rng.sample(self.candidates, self.count))


def planned_server_kill(at: float, client_kill_interval: float | None) -> float:
    """Seconds after the start at which the server kill is planned: `at`, or with random client
    kills every `client_kill_interval` seconds the first round due at or after `at` (rounds are
    nominally at multiples of the interval; in a run they drift later by the time kills take)."""
    if client_kill_interval is None:
        return at
    rounds = max(1, math.ceil(at / client_kill_interval - 1e-9))
    return rounds * client_kill_interval


def check_server_kill(
    at: float | None, duration: float | None, client_kill_interval: float | None
) -> None:
    """Raise ValueError naming the option at fault; `duration` is the headless run's length
    (None: no limit)."""
    if at is None:
        return
    if not math.isfinite(at) or at <= 0:
        raise ValueError(f"--kill-server-at must be a positive number of seconds, got {at:g}")
    if duration is None:
        return
    planned = planned_server_kill(at, client_kill_interval)
    if planned >= duration:
        detail = ""
        if planned != at:
            detail = (
                f" (with random kills the server is killed at the first round of client kills "
                f"at or after it: {planned:g} s)"
            )
        raise ValueError(
            f"--kill-server-at {at:g} must come before the end of the run, --duration "
            f"{duration:g}{detail}"
        )


@dataclass
class ServerKillSchedule:
    """Decides when the one server kill is due (see the module doc)."""

    at: float
    start: float = 0.0
    done: bool = False

    def __post_init__(self) -> None:
        check_server_kill(self.at, None, None)

    def take(self, now: float, client_round_due: bool = True) -> bool:
        """Whether the server is to be killed at `now` (true at most once). With random client
        kills, pass whether a round of them is due at `now`: the kill waits for one."""
        if self.done or now < self.start + self.at or not client_round_due:
            return False
        self.done = True
        return True

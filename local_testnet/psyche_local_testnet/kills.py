"""Random-kill schedule: when to kill, and which clients (pure; the orchestrator does the kill).

Every `interval` seconds (the first one interval after the start) `count` distinct victims are
drawn from the allowed client numbers (1-based; empty = every client). The server is never a
candidate. The random source is injectable so tests are deterministic.
"""

from __future__ import annotations

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

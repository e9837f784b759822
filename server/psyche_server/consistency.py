"""Weights-hash consistency: every client reports a hash of its weights per step; the server
flags any client whose hash differs from the majority at that step (pure bookkeeping)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepVerdict:
    """Hash agreement at one step. `majority` is None when no hash has a strict plurality."""

    step: int
    majority: bytes | None
    reports: int
    divergent: frozenset[bytes]


@dataclass
class WeightsHashTracker:
    """Keeps the reports of the last `max_steps` steps: `{step: {client id: weights hash}}`."""

    max_steps: int = 64
    reports: dict[int, dict[bytes, bytes]] = field(default_factory=dict)

    def record(self, step: int, client_id: bytes, weights_hash: bytes) -> StepVerdict:
        """Store a report (the latest one per client and step wins) and judge that step."""
        self.reports.setdefault(step, {})[client_id] = weights_hash
        while len(self.reports) > self.max_steps:
            del self.reports[min(self.reports)]
        return self.verdict(step)

    def verdict(self, step: int) -> StepVerdict:
        by_client = self.reports.get(step, {})
        counts = Counter(by_client.values()).most_common(2)
        if not counts:
            return StepVerdict(step, None, 0, frozenset())
        majority: bytes | None = counts[0][0]
        if len(counts) == 2 and counts[1][1] == counts[0][1]:
            majority = None  # a tie: nobody can be called the outlier
        divergent = (
            frozenset(cid for cid, h in by_client.items() if h != majority)
            if majority is not None
            else frozenset()
        )
        return StepVerdict(step, majority, len(by_client), divergent)

    def latest(self) -> StepVerdict | None:
        """The verdict of the newest step with at least one report."""
        return self.verdict(max(self.reports)) if self.reports else None

    def divergent_clients(self) -> frozenset[bytes]:
        """Clients that disagreed with the majority at any remembered step."""
        flagged: set[bytes] = set()
        for step in self.reports:
            flagged |= self.verdict(step).divergent
        return frozenset(flagged)

"""Weights-hash consistency: every client reports a hash of its weights per step; the server
flags any client whose hash differs from the majority at that step (pure bookkeeping)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("psyche.server.consistency")


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


class WeightsHashMonitor:
    """A tracker that logs each (step, client) found to disagree with the majority once."""

    def __init__(
        self,
        tracker: WeightsHashTracker | None = None,
        on_divergence: Callable[[bytes, int, bytes], None] | None = None,
    ) -> None:
        self.tracker = tracker or WeightsHashTracker()
        self.on_divergence = on_divergence
        """Called once per flagged (client, step) with the majority's hash."""
        self._flagged: set[tuple[int, bytes]] = set()

    def record(self, step: int, client_id: bytes, weights_hash: bytes) -> StepVerdict:
        verdict = self.tracker.record(step, client_id, weights_hash)
        oldest = min(self.tracker.reports)
        self._flagged = {(s, c) for s, c in self._flagged if s >= oldest}
        for outlier in sorted(verdict.divergent - {c for s, c in self._flagged if s == step}):
            self._flagged.add((step, outlier))
            log.warning(
                "weights of %s at step %d differ from the majority (%d reports)",
                outlier[:4].hex(),
                step,
                verdict.reports,
                extra={
                    "event": "weights_divergence",
                    "client": outlier[:4].hex(),
                    "step": step,
                    "weights_hash": self.tracker.reports[step][outlier].hex(),
                    "majority_hash": verdict.majority.hex() if verdict.majority else None,
                },
            )
            if self.on_divergence is not None and verdict.majority is not None:
                self.on_divergence(outlier, step, verdict.majority)
        return verdict

    def latest(self) -> StepVerdict | None:
        return self.tracker.latest()

    def divergent_clients(self) -> frozenset[bytes]:
        return self.tracker.divergent_clients()

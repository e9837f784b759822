"""Weights-hash consistency: every member reports a hash of its weights per step; the server
flags a member whose hash differs from the hash a majority of the members reported (pure
bookkeeping, no I/O).

Only the current epoch's members count (`set_members`; a report from any other key is
ignored, so keys that never joined cannot outvote the members), only the steps of a bounded
window behind the coordinator's step (`advance`), and only a strict majority of the *members*
(not of whoever reported) names a hash: a tie, or too few reports, flags nobody. A member that
leaves (`forget`, or a new member list) takes its reports with it.

A majority counts *voters*, not keys: `set_members` takes a `voter` function (in a
permissioned run, `Admission.voter`: a delegate votes with its authorizer), each voter has
one vote, shared equally by its members (weights are exact fractions), and a hash wins with
more than half of the voters' votes. In an open run every key is its own voter. So one listed
key that delegates many keys still casts one vote. Memory is at most
`window` × members reports; recording a report costs O(1) except when it creates or breaks a
step's majority (then that one step is re-judged, O(members)).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

log = logging.getLogger("psyche.server.consistency")

DEFAULT_WINDOW = 16
"""Steps judged: the coordinator's step and the ones just before it."""

FUTURE_STEPS = 2
"""Reports may name a step this far ahead of the coordinator's (clocks and broadcasts race)."""


@dataclass(frozen=True)
class StepVerdict:
    """Hash agreement at one step. `majority` is None unless more than half of the members
    reported one hash."""

    step: int
    majority: bytes | None
    reports: int
    divergent: frozenset[bytes]


def _own_vote(client_id: bytes) -> bytes:
    return client_id


@dataclass
class _Step:
    hashes: dict[bytes, bytes] = field(default_factory=dict)
    counts: defaultdict[bytes, Fraction] = field(default_factory=lambda: defaultdict(Fraction))
    """Votes per hash: the sum of the weights of the members that reported it."""
    majority: bytes | None = None
    divergent: set[bytes] = field(default_factory=set)

    def recount(self, weights: Mapping[bytes, Fraction]) -> None:
        self.counts = defaultdict(Fraction)
        for client_id, weights_hash in self.hashes.items():
            self.counts[weights_hash] += weights[client_id]

    def judge(self, voters: int) -> list[bytes]:
        """Recompute the majority and the divergent set; returns the members newly divergent."""
        top = max(self.counts.items(), key=lambda item: item[1], default=None)
        self.majority = top[0] if top is not None and 2 * top[1] > voters else None
        before = self.divergent
        if self.majority is None:
            self.divergent = set()
        else:
            self.divergent = {c for c, h in self.hashes.items() if h != self.majority}
        return sorted(self.divergent - before)

    def remove(self, client_id: bytes, weight: Fraction) -> bool:
        """Drop a client's report (counted with `weight`); True if it had one."""
        old = self.hashes.pop(client_id, None)
        if old is None:
            return False
        self.counts[old] -= weight
        if not self.counts[old]:
            del self.counts[old]
        self.divergent.discard(client_id)
        return True


@dataclass
class WeightsHashTracker:
    """The reports of the members over the last `window` steps: `{step: {member: hash}}`."""

    window: int = DEFAULT_WINDOW
    members: frozenset[bytes] = frozenset()
    weights: dict[bytes, Fraction] = field(default_factory=dict)
    """Each member's share of its voter's one vote."""
    voters: int = 0
    """Distinct voters among the members (the votes a majority needs more than half of)."""
    head: int = 0
    """The coordinator's step (`advance`); steps at or below `head - window` are forgotten."""
    _steps: dict[int, _Step] = field(default_factory=dict)
    _voter: Callable[[bytes], bytes] = _own_vote

    @property
    def reports(self) -> dict[int, dict[bytes, bytes]]:
        """A copy of the kept reports, `{step: {member: hash}}` (for logs and tests)."""
        return {step: dict(s.hashes) for step, s in sorted(self._steps.items())}

    def set_members(
        self, members: Iterable[bytes], voter: Callable[[bytes], bytes] = _own_vote
    ) -> list[tuple[int, bytes]]:
        """The epoch's members (and whose vote each casts) changed: drop the reports of the
        keys no longer members, reweigh and re-judge (fewer voters need fewer votes).
        Returns the (step, member) pairs that became divergent."""
        new = frozenset(members)
        groups = Counter(voter(client_id) for client_id in new)
        weights = {client_id: Fraction(1, groups[voter(client_id)]) for client_id in new}
        if new == self.members and weights == self.weights:
            return []
        gone = self.members - new
        self.members, self.weights, self.voters = new, weights, len(groups)
        self._voter = voter
        for step in self._steps.values():
            for client_id in gone:
                step.hashes.pop(client_id, None)
                step.divergent.discard(client_id)
            step.recount(weights)
        return self._rejudge_all()

    def forget(self, client_id: bytes) -> list[tuple[int, bytes]]:
        """`client_id` left (disconnected): it is no member and its reports are dropped."""
        if client_id not in self.members:
            return []
        return self.set_members(self.members - {client_id}, self._voter)

    def advance(self, step: int) -> None:
        """The coordinator is at `step`: forget the steps that fell out of the window."""
        if step <= self.head:
            return
        self.head = step
        oldest = step - self.window
        for old in [s for s in self._steps if s <= oldest]:
            del self._steps[old]

    def accepts(self, step: int, client_id: bytes) -> bool:
        """Whether a report of `client_id` at `step` counts: a member, a step in the window."""
        return client_id in self.members and self.head - self.window < step <= (
            self.head + FUTURE_STEPS
        )

    def record(self, step: int, client_id: bytes, weights_hash: bytes) -> list[bytes]:
        """Store a member's report (its latest one per step wins); returns the members that
        became divergent at `step` (ignored reports return [])."""
        if not self.accepts(step, client_id):
            return []
        entry = self._steps.setdefault(step, _Step())
        if entry.hashes.get(client_id) == weights_hash:
            return []
        weight = self.weights[client_id]
        entry.remove(client_id, weight)
        entry.hashes[client_id] = weights_hash
        entry.counts[weights_hash] += weight
        had_majority = entry.majority
        if had_majority is not None and entry.counts[had_majority] * 2 > self.voters:
            if weights_hash != had_majority:  # the majority stands: judge this report only
                entry.divergent.add(client_id)
                return [client_id]
            return []
        if had_majority is None and entry.counts[weights_hash] * 2 <= self.voters:
            return []  # still no majority
        return entry.judge(self.voters)

    def hash_of(self, step: int, client_id: bytes) -> bytes | None:
        entry = self._steps.get(step)
        return None if entry is None else entry.hashes.get(client_id)

    def majority(self, step: int) -> bytes | None:
        entry = self._steps.get(step)
        return None if entry is None else entry.majority

    def verdict(self, step: int) -> StepVerdict:
        entry = self._steps.get(step)
        if entry is None:
            return StepVerdict(step, None, 0, frozenset())
        return StepVerdict(step, entry.majority, len(entry.hashes), frozenset(entry.divergent))

    def latest(self) -> StepVerdict | None:
        """The verdict of the newest step with at least one report."""
        steps = [s for s, entry in self._steps.items() if entry.hashes]
        return self.verdict(max(steps)) if steps else None

    def divergent_clients(self) -> frozenset[bytes]:
        """Members that disagree with the majority at any step of the window."""
        flagged: set[bytes] = set()
        for entry in self._steps.values():
            flagged |= entry.divergent
        return frozenset(flagged)

    def size(self) -> int:
        """Reports held (at most `window + FUTURE_STEPS` × members)."""
        return sum(len(entry.hashes) for entry in self._steps.values())

    def _rejudge_all(self) -> list[tuple[int, bytes]]:
        flagged: list[tuple[int, bytes]] = []
        for step, entry in sorted(self._steps.items()):
            flagged.extend((step, c) for c in entry.judge(self.voters))
        return flagged


class WeightsHashMonitor:
    """A tracker that logs each (step, member) found to disagree with the majority once, and
    calls `on_divergence(member, step, majority_hash)` for it."""

    def __init__(
        self,
        tracker: WeightsHashTracker | None = None,
        on_divergence: Callable[[bytes, int, bytes], None] | None = None,
    ) -> None:
        self.tracker = tracker or WeightsHashTracker()
        self.on_divergence = on_divergence

    def set_members(
        self, members: Iterable[bytes], voter: Callable[[bytes], bytes] = _own_vote
    ) -> None:
        self._report(self.tracker.set_members(members, voter))

    def forget(self, client_id: bytes) -> None:
        self._report(self.tracker.forget(client_id))

    def advance(self, step: int) -> None:
        self.tracker.advance(step)

    def record(self, step: int, client_id: bytes, weights_hash: bytes) -> StepVerdict | None:
        """Record a report; returns the step's verdict, or None when the report does not count
        (not a member, or a step outside the window)."""
        if not self.tracker.accepts(step, client_id):
            return None
        self._report([(step, c) for c in self.tracker.record(step, client_id, weights_hash)])
        return self.tracker.verdict(step)

    def _report(self, flagged: list[tuple[int, bytes]]) -> None:
        for step, outlier in flagged:
            majority = self.tracker.majority(step)
            reported = self.tracker.hash_of(step, outlier)
            log.warning(
                "weights of %s at step %d differ from the majority of %d members (%d voters)",
                outlier[:4].hex(),
                step,
                len(self.tracker.members),
                self.tracker.voters,
                extra={
                    "event": "weights_divergence",
                    "client": outlier[:4].hex(),
                    "step": step,
                    "weights_hash": reported.hex() if reported else None,
                    "majority_hash": majority.hex() if majority else None,
                },
            )
            if self.on_divergence is not None and majority is not None:
                self.on_divergence(outlier, step, majority)

    def latest(self) -> StepVerdict | None:
        return self.tracker.latest()

    def divergent_clients(self) -> frozenset[bytes]:
        return self.tracker.divergent_clients()

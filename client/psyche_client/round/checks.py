"""What a verifier keeps about the round it checks, and its pure decisions (no I/O).

A verifier recomputes a reference for each batch of its sample (`verifier_sample`) on the
weights the round's trainers start from (`expected_weights`), then scores every verified
result announced for those batches against it, once each, and reports a trainer at most once
per round when a score falls below the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from psyche_common.batch_id import BatchId


@dataclass
class VerifierChecks:
    expected_weights: bytes
    references: dict[BatchId, object] = field(default_factory=dict)
    scored: set[bytes] = field(default_factory=set)
    """Commitments (`ResultAnnouncement.commitment`) already scored."""
    accused: set[bytes] = field(default_factory=set)
    """Trainers already reported this round (the coordinator counts one per trainer)."""
    agreements: dict[bytes, float] = field(default_factory=dict)
    """Commitment → measured agreement (for logs and tests)."""

    def wants(self, batch: BatchId, commitment: bytes) -> bool:
        """Whether a verified result for `batch` with `commitment` still needs its score."""
        return batch in self.references and commitment not in self.scored

    def verdict(self, trainer: bytes, agreement: float, threshold: float) -> bool:
        """Record a score; True when `trainer` must now be reported."""
        if agreement >= threshold or trainer in self.accused:
            return False
        self.accused.add(trainer)
        return True


def agreement_milli(agreement: float) -> int:
    """An agreement in [0, 1] as thousandths (what the coordinator records), clamped."""
    if not math.isfinite(agreement):
        return 0
    return max(0, min(1000, round(agreement * 1000)))

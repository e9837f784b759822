"""What a verifier keeps about the round it checks, and its pure decisions (no I/O).

A verifier recomputes a reference for each batch of its sample (`verifier_sample`) on the
weights the round's trainers start from (`expected_weights`), then scores every verified
result announced for those batches against it, once each, and reports each batch once: an
accusation when the score falls below the threshold, an attestation (a pass) otherwise.
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
    reported: set[BatchId] = field(default_factory=set)
    """Batches already reported this round (the coordinator takes one report per batch)."""
    agreements: dict[bytes, float] = field(default_factory=dict)
    """Commitment → measured agreement (for logs and tests)."""

    def wants(self, batch: BatchId, commitment: bytes) -> bool:
        """Whether a verified result for `batch` with `commitment` still needs its score."""
        return batch in self.references and commitment not in self.scored

    def verdict(self, batch: BatchId, agreement: float, threshold: float) -> bool | None:
        """Record a score for `batch`: True to accuse, False to attest, None when the batch
        was reported already (a second result for one batch)."""
        if batch in self.reported:
            return None
        self.reported.add(batch)
        return not agreement >= threshold  # NaN accuses


def agreement_milli(agreement: float) -> int:
    """An agreement in [0, 1] as thousandths (what the coordinator records), clamped."""
    if not math.isfinite(agreement):
        return 0
    return max(0, min(1000, round(agreement * 1000)))

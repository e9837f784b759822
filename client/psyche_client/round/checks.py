"""What a verifier keeps about the round it checks, and its pure decisions (no I/O).

A verifier recomputes a reference for every batch of the round on the weights the round's
trainers start from (`expected_weights`): its sample (`verifier_sample`) is revealed only
once the round's results are committed, when those weights may already have moved. Once the
sample is known (`reveal`) it keeps the references of the sampled batches, scores every
verified result announced for them against it, once each, and reports each batch once: an
accusation when a check fails (`failure`: the sign agreement is below its threshold, the result
repeats an earlier one of another trainer, or it follows another batch of the sample better than
its own), an attestation (a pass) otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from psyche_common.batch_id import BatchId

from psyche_client.training.backend import Reference
from psyche_client.verify.threshold import ACCUSE_BELOW, COPY_OVERLAP, MARGIN_BELOW


@dataclass
class VerifierChecks:
    expected_weights: bytes
    references: dict[BatchId, Reference] = field(default_factory=dict)
    sample: tuple[BatchId, ...] | None = None
    """The batches to check, once the coordinator revealed the round's sample seed."""
    scored: set[bytes] = field(default_factory=set)
    """Commitments (`ResultAnnouncement.commitment`) already scored."""
    reported: set[BatchId] = field(default_factory=set)
    """Batches already reported this round (the coordinator takes one report per batch)."""
    agreements: dict[bytes, float] = field(default_factory=dict)
    """Commitment → measured agreement (for logs and tests)."""

    def reveal(self, sample: list[BatchId]) -> None:
        """The sample is known: keep only its references (the others are never scored)."""
        self.sample = tuple(sample)
        self.references = {b: r for b, r in self.references.items() if b in self.sample}

    def wants(self, batch: BatchId, commitment: bytes) -> bool:
        """Whether a verified result for `batch` with `commitment` still needs its score."""
        return (
            self.sample is not None and batch in self.references and commitment not in self.scored
        )

    def verdict(self, batch: BatchId, agreement: float, threshold: float) -> bool | None:
        """Record a score for `batch`: True to accuse, False to attest, None when the batch
        was reported already (a second result for one batch)."""
        return self.report(batch, Score(agreement), Thresholds(threshold))

    def report(self, batch: BatchId, score: Score, thresholds: Thresholds) -> bool | None:
        """`verdict` on a whole `Score`: True when `failure` names a failed check."""
        if batch in self.reported:
            return None
        self.reported.add(batch)
        return failure(score, thresholds) is not None


@dataclass(frozen=True)
class Thresholds:
    """Where each check fails (`verify.threshold` has the measured defaults)."""

    agreement: float = ACCUSE_BELOW
    margin: float = MARGIN_BELOW
    overlap: float = COPY_OVERLAP


@dataclass(frozen=True)
class Score:
    """One result's checks: `agreement` with its own batch's recomputed gradient; `margin`,
    that agreement minus the agreement with another batch of the verifier's sample (None with
    one batch); `overlap`, the largest top-k index overlap with an earlier result of another
    trainer in the round, and `copied_from`, that result's commitment."""

    agreement: float
    margin: float | None = None
    overlap: float = 0.0
    copied_from: bytes | None = None


def failure(score: Score, thresholds: Thresholds) -> str | None:
    """Which check `score` fails, or None when it passes every one: `"disagrees"` (its signs
    do not follow its batch's gradient; NaN fails), `"copy"` (it repeats an earlier result of
    another trainer), `"other_data"` (it follows another batch better than its own)."""
    if not score.agreement >= thresholds.agreement:
        return "disagrees"
    if score.copied_from is not None and score.overlap >= thresholds.overlap:
        return "copy"
    if score.margin is not None and score.margin < thresholds.margin:
        return "other_data"
    return None


def agreement_milli(agreement: float) -> int:
    """An agreement in [0, 1] as thousandths (what the coordinator records), clamped."""
    if not math.isfinite(agreement):
        return 0
    return max(0, min(1000, round(agreement * 1000)))

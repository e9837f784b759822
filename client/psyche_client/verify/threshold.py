"""The verifier's decision thresholds, apart from the tensor code that computes agreements, so
that the round pipeline can read it without loading torch."""

from __future__ import annotations

ACCUSE_BELOW = 0.6
"""A result whose |coefficient|-weighted sign agreement is below this is reported. Measured
(bench/verification.py, docs/verification.md, 92 samples in three runs): honest results
scored 0.78 to 1.0, negated ones 0.0 to 0.22 and random signs 0.32 to 0.65. With tiny
batches and trainers alternating with verifier rounds honest results went down to 0.58 (2 of
272 checks below 0.6: an open false-positive rate, docs/verification.md)."""

COPY_OVERLAP = 0.7
"""A result whose top-k positions overlap an earlier result of another trainer of the same
round by at least this share is a copy (`verify.copying.index_overlap`). Measured
(bench/verification.py, docs/verification.md, 272 checks in seven runs): honest results of one
step overlap each other by at most 0.40 (trainers alternating with verifier rounds; 0.27 when
every peer trains every step); a copy overlaps by 1.0."""

MARGIN_BELOW = -0.25
"""A result whose agreement with its own batch's gradient minus its agreement with another
batch's (the verifier's other sample) is below this was trained on other data. Measured over
the same 272 checks: honest margins were -0.16 at the lowest (trainers alternating with verifier
rounds, tiny batches, a constant LR; -0.11 at that size when every peer trains every step); a
stale result (its trainer's own result of an earlier step) fell below -0.25 in 33 of them."""

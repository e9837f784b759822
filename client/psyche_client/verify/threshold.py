"""The verifier's decision threshold, apart from the tensor code that computes agreements, so
that the round pipeline can read it without loading torch."""

from __future__ import annotations

ACCUSE_BELOW = 0.6
"""A result whose |coefficient|-weighted sign agreement is below this is reported. Measured
(bench/verification.py, docs/verification.md, 92 samples in three runs): honest results
scored 0.78 to 1.0, negated ones 0.0 to 0.22 and random signs 0.32 to 0.65."""

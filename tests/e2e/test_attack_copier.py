"""A copier (real processes, the tiny real model): a trainer that re-announces another
trainer's result of the same round as its result for its own batch
(tests/e2e/copier_client.py).

The copy carries its own valid commitment, and its signs agree with the copier's batch about as
well as an honest result's do; what gives it away is that its top-k positions are the
original's (overlap 1.0; honest results of one round overlap by at most about 0.4,
docs/verification.md). Every verifier holds both results (every client downloads all of them)
and accuses the one announced later, the copy; at 50 % of four clients both verifiers check
both batches, so both accuse every copy, and the copier is convicted at the second round it
copies (strikes must come from two steps: docs/verification.md). It copies only when the
other trainer's result arrives within its wait (twice in one 10-step run, convicted at step
7), so the run has 14 steps. The honest weights hashes agree at every step and the honest
trainer is never convicted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.attack_catalog import ATTACKS
from bench.harness.attack_run import client_id, run_attack

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # the tiny real model, 14 steps


def test_a_copier_is_convicted_and_splits_nobody(tmp_path: Path) -> None:
    attack = ATTACKS["copier"]
    assert attack.verification_percent == 50
    run = run_attack(tmp_path, attack, clients=4, malicious=1, steps=14)
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= 5, run.diagnostics
    copies = run.attackers[0].events("copier: copied a result")
    assert copies, f"the copier copied nothing\n{run.diagnostics}"
    assert run.attackers_removed == [True], run.diagnostics
    assert run.honest_convicted == [], run.honest_convicted
    reports = [
        line
        for p in run.honest
        for line in p.events("verifier scored")
        if line.get("trainer") == client_id(run.attackers[0]) and line.get("failed") == "copy"
    ]
    assert reports, "no verifier reported a copy"
    print(f"copies {len(copies)}, removed at {run.removal_steps}, copy reports {len(reports)}")

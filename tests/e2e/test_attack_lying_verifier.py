"""A lying verifier (real processes, the tiny real model): a verifier that reports every
result it checks as failed (tests/e2e/lying_verifier_client.py).

One verifier never convicts: each accusation of an honest result is met by the other
verifier's pass of the same commitment (at 50 % of four clients both verifiers check both
batches), so it stands for nobody. That tie counts against neither side, so with two
verifiers a round nobody outnumbers the liar and it is not removed (docs/security.md: it
is removed where two honest verifiers outvote it, as at 8 clients and 50 % in
tests/integration/test_verification_simulation.py). Checked: no honest client convicted,
honest weights hashes identical at every step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.attack_catalog import ATTACKS
from bench.harness.attack_run import run_attack

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # the tiny real model, 10 steps


def test_a_lying_verifier_convicts_nobody(tmp_path: Path) -> None:
    attack = ATTACKS["lying_verifier"]
    run = run_attack(tmp_path, attack, clients=4, malicious=1, steps=16)
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= 10, run.diagnostics
    lies = run.attackers[0].events("lying verifier: accused a passing result")
    assert lies, f"the liar never verified\n{run.diagnostics}"
    assert run.honest_convicted == [], run.honest_convicted
    print(f"lies {len(lies)}, removed at {run.removal_steps}")

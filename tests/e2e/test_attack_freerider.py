"""A free rider (real processes, the tiny real model): a trainer that trains once and then
re-sends that first result, relabelled, for every later batch (tests/e2e/freerider_client.py).

Its results carry valid commitments and follow some real data, so they decode, verify and
are applied like any result until verifiers catch them: the free-rider check (its agreement
with its own batch against another batch of the verifier's sample, docs/verification.md)
catches a stale result only in some rounds, so it may or may not be convicted in a short run.
What is checked is what must hold either way: the honest clients' weights hashes are
identical at every applied step, its stale results were really sent, no honest client is
convicted, and the held-out loss after the run is at most 5% above a clean run's (four honest
clients, the same settings, measured in the same session).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.attack_catalog import ATTACKS
from bench.harness.attack_run import run_attack
from tests.e2e.conftest import ATTACK_TEST_STEPS, CleanRun

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # a clean run and an attacked one

LOSS_TOLERANCE = 0.05


def test_a_free_rider_cannot_split_honest_clients_or_move_the_loss(
    tmp_path: Path, clean_run: CleanRun
) -> None:
    attack = ATTACKS["freerider"]
    clean = clean_run(attack.quantize_1bit, attack.verification_percent)
    run = run_attack(tmp_path, attack, clients=4, malicious=1, steps=ATTACK_TEST_STEPS)
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= ATTACK_TEST_STEPS - 4, run.diagnostics
    assert run.losses_finite
    stale = run.attackers[0].events("free rider: sent a stale result")
    # its first trained result is its own, and each round's verifier is drawn at random: one
    # fresh-clone run made it the verifier in 5 of its 7 rounds, so it sent 1 stale result
    # (requiring two fails about 1 % of runs, requiring one about 0.1 %)
    assert stale, "the free rider sent no stale result"
    assert run.honest_convicted == [], run.honest_convicted
    assert clean.eval_loss is not None and run.eval_loss is not None
    ratio = run.eval_loss / clean.eval_loss
    print(
        f"eval loss: clean {clean.eval_loss:.4f}, attacked {run.eval_loss:.4f} ({ratio:.4f}); "
        f"stale results {len(stale)}, removed {run.attackers_removed} at {run.removal_steps}"
    )
    # one-sided: the attack must not cost more than 5 %; an attacked run that ends below its
    # clean twin (a loaded machine can cost the clean run applied steps) is no harm
    assert ratio <= 1.0 + LOSS_TOLERANCE, (clean.eval_loss, run.eval_loss)

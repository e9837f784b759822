"""A free rider (real processes, the tiny real model): a trainer that re-announces another
trainer's result of the same step as its result for its own batch
(tests/e2e/freerider_client.py).

What the protocol can prove about it is nothing: the copy is relabelled with the free rider's
step and batch and carries its own valid commitment, so it decodes, verifies and is applied
like any result; the verifiers' sign check scores it like an honest result most of the time
(docs/verification.md), so it may or may not be convicted. What is checked is what must hold
either way: the honest clients' weights hashes are identical at every applied step, its
copies were really sent and applied, and the held-out loss after the run is within 5% of a
clean run's (four honest clients, the same settings, measured in the same session).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.attack_run import ATTACKS, RunOutcome, client_id, run_attack
from tests.e2e.conftest import ATTACK_TEST_STEPS

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # a clean run and an attacked one

LOSS_TOLERANCE = 0.05


def test_a_free_rider_cannot_split_honest_clients_or_move_the_loss(
    tmp_path: Path, clean_run: Callable[[bool, int], RunOutcome]
) -> None:
    attack = ATTACKS["freerider"]
    clean = clean_run(attack.quantize_1bit, attack.verification_percent)
    run = run_attack(tmp_path, attack, clients=4, malicious=1, steps=ATTACK_TEST_STEPS)
    assert run.honest_ok, run.diagnostics
    assert run.hashes_agree and len(run.common_steps) >= ATTACK_TEST_STEPS - 4, run.diagnostics
    assert run.losses_finite
    copies = run.attackers[0].events("free rider: copied a result")
    assert len(copies) >= 3, f"the free rider copied only {len(copies)} results"
    honest_ids = {client_id(p) for p in run.honest}
    assert {c["copied_from"] for c in copies} <= honest_ids, copies
    bad = client_id(run.attackers[0])
    applied = [e for p in run.honest for e in p.events("applied step") if bad in e["senders"]]
    assert applied, "no honest client applied a copy of the free rider"
    assert clean.eval_loss is not None and run.eval_loss is not None
    ratio = run.eval_loss / clean.eval_loss
    print(
        f"eval loss: clean {clean.eval_loss:.4f}, attacked {run.eval_loss:.4f} ({ratio:.4f}); "
        f"copies {len(copies)}, removed {run.attackers_removed}"
    )
    assert abs(ratio - 1.0) <= LOSS_TOLERANCE, (clean.eval_loss, run.eval_loss)

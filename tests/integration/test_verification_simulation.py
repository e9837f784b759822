"""The conviction rules over whole simulated runs (pure coordinator, fake clock; issue 18,
finding 5): one lying verifier that accuses every result it checks never gets an honest
trainer convicted, is removed as a refuted accuser where verifiers overlap, and a cheat is
still convicted, even with a single verifier per round (bench/convictions.py has the table).
"""

from __future__ import annotations

import pytest

from tests.support.verification_sim import measure


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_lying_verifier_convicts_no_honest_trainer_and_is_removed(seed: int) -> None:
    stats = measure(seed, members=8, percent=25, liars=1, total_steps=80)
    assert stats.steps == 80 and stats.liar_checks >= 4  # each an accusation of an honest result
    assert stats.false_convictions == 0 and stats.honest_accusers_removed == 0
    assert stats.liar_removals, "the refuted liar stayed"


def test_a_lone_liar_among_four_convicts_nobody_and_a_cheat_is_convicted() -> None:
    liar = measure(3, members=4, percent=25, liars=1, total_steps=60)
    assert liar.liar_checks >= 10 and liar.false_convictions == 0
    cheat = measure(4, members=4, percent=25, liars=0, cheats=1, total_steps=60)
    assert cheat.cheat_convictions and cheat.cheat_convictions[0] <= 20
    assert cheat.false_convictions == 0

"""The conviction rules over whole simulated runs (pure coordinator, fake clock; issue 18,
finding 5): one lying verifier that accuses every result it checks never gets an honest
trainer convicted, is removed as a refuted accuser where verifiers overlap, and a cheat is
still convicted, even with a single verifier per round; and one honest result that fails the
check by bad luck, accused by every verifier that sampled it, convicts nobody
(bench/convictions.py has the table).
"""

from __future__ import annotations

import pytest

from bench.study.verification_sim import measure


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


def test_one_unlucky_honest_check_no_longer_convicts_at_four_clients_and_50_percent() -> None:
    """Both verifiers of a 4-client round at 50 % check both batches, and verifiers are
    deterministic: an honest result that fails the check by bad luck (about 1 % of tiny-batch
    checks) is accused by both. The rule before the step rule convicted on that one step; now
    strikes must come from two steps, and a cheat, which fails every checked round, still
    goes."""
    honest = measure(0, members=4, percent=50, liars=0, total_steps=200, unlucky=0.01)
    assert honest.unlucky_results >= 3
    assert len(honest.one_step_rule) == honest.unlucky_results  # each convicted, before
    assert honest.false_convictions == 0
    cheat = measure(5, members=4, percent=50, liars=0, cheats=1, total_steps=60)
    assert cheat.cheat_convictions and cheat.false_convictions == 0

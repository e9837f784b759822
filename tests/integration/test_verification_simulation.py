"""The conviction rules over whole simulated runs (pure coordinator, fake clock; issue 18,
finding 5): one lying verifier that accuses every result it checks never gets an honest
trainer convicted, is removed as a refuted accuser where verifiers overlap, and a cheat is
still convicted, even with a single verifier per round; and one honest result that fails the
check by bad luck, accused by every verifier that sampled it, convicts nobody
(bench/convictions.py has the table). Adaptive attackers (issue 29): a cheat that cheats only
when it predicts it goes unchecked, two verifiers that shield a cheat, and a verifier that
accuses only the batches it alone checks.
"""

from __future__ import annotations

import pytest

from bench.study.verification_sim import measure


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_lying_verifier_convicts_no_honest_trainer_and_is_removed(seed: int) -> None:
    """At 8 clients / 25 % (two verifiers a round) the liar ties with the one honest verifier
    it shares a batch with, which counts against neither: it stays, and convicts nobody. At
    50 % (four a round) two honest passers outvote it and it is removed."""
    stats = measure(seed, members=8, percent=25, liars=1, total_steps=80)
    assert stats.steps == 80 and stats.liar_checks >= 4  # each an accusation of an honest result
    assert stats.false_convictions == 0 and stats.honest_accusers_removed == 0
    stats = measure(seed, members=8, percent=50, liars=1, total_steps=80)
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
    # each convicted before (two unlucky results of one trainer in an epoch count once)
    assert len(honest.one_step_rule) >= honest.unlucky_results - honest.twice_unlucky
    # now only a trainer with two unlucky results in one epoch, each seen by the same two
    # verifiers, can be (docs/verification.md)
    assert honest.false_convictions <= honest.twice_unlucky < len(honest.one_step_rule)
    cheat = measure(5, members=4, percent=50, liars=0, cheats=1, total_steps=60)
    assert cheat.cheat_convictions and cheat.false_convictions == 0


def test_a_selective_cheat_can_no_longer_predict_its_checks_and_is_convicted() -> None:
    """With the sample seed public when the round starts, the cheat cheats only in rounds no
    verifier samples, and is never convicted; hidden until RoundWitness, its prediction is a
    guess and the rounds it cheats in are checked like any other."""
    public = measure(0, members=4, percent=25, liars=0, selective=1, hidden_sample=False)
    assert public.cheat_rounds >= 10 and public.cheated_unchecked == public.cheat_rounds
    assert public.cheat_convictions == []
    hidden = measure(0, members=4, percent=25, liars=0, selective=1)
    assert hidden.cheat_rounds >= 10 and hidden.cheated_unchecked < hidden.cheat_rounds
    assert hidden.cheat_convictions and hidden.false_convictions == 0


def test_two_shielding_passers_convict_no_honest_verifier() -> None:
    """Two colluders pass every result of a cheat: a pass refutes an accusation only when
    passers outnumber accusers, so honest accusers are never removed, and the cheat still
    goes."""
    stats = measure(1, members=8, percent=50, liars=0, cheats=1, shielders=2)
    assert stats.honest_accusers_removed == 0 and stats.false_convictions == 0
    assert stats.cheat_convictions


def test_a_sole_liar_with_unlucky_honest_checks_convicts_nobody() -> None:
    """A verifier that accuses only the batches it alone checks is never refuted; with 1 % of
    honest results failing by bad luck the rule before (any two verifiers across two steps)
    convicted honest trainers on its word plus one unlucky check; each verifier now needs
    standing accusations at two steps of its own."""
    stats = measure(0, members=4, percent=25, liars=0, sole_liars=1, unlucky=0.01)
    assert stats.liar_checks >= 20 and stats.unlucky_results >= 1
    assert stats.two_step_rule, "the previous rule would have convicted here"
    assert stats.false_convictions == 0 and stats.honest_accusers_removed == 0

"""One vote per listed key with its delegates on the client side: the joiner's manifest vote
(`p2p.model_share.choose_manifest`) and the Warmup weights check (`weights.sync.
majority_weights`) count voters, so an authorizer's delegates cannot outvote honest listed
keys; without authorizers (an open run) every key votes as before."""

from __future__ import annotations

from psyche_client.p2p.manifest import ModelManifest, parameter_info
from psyche_client.p2p.model_share import choose_manifest
from psyche_client.weights.sync import majority_weights
from psyche_common.votes import voter_weights

HONEST = [bytes([1, i]) * 16 for i in range(2)]
ARMY = [bytes([2, i]) * 16 for i in range(4)]
AUTHORIZER = bytes([9]) * 32
AUTHORIZERS = {delegate: AUTHORIZER for delegate in ARMY}
ME = bytes([3]) * 32


def model(seed: int) -> ModelManifest:
    data = bytes([seed]) * 64
    return ModelManifest.build(
        step=7, epoch=1, parameters=[parameter_info("w", "uint8", [64], data)], config_json="{}"
    )


def test_weights_are_exact_shares_of_one_vote() -> None:
    weights, voters = voter_weights([*HONEST, *ARMY], AUTHORIZERS)
    assert voters == 3
    assert sum(weights.values()) == 3 and weights[ARMY[0]] * 4 == 1 and weights[HONEST[0]] == 1


def test_delegates_do_not_outvote_listed_keys_in_the_manifest_vote() -> None:
    honest, lie = model(1), model(2)
    answers = {**{p: honest for p in HONEST}, **{p: lie for p in ARMY}}
    # an open run: four keys against two, the lie wins
    holders, why = choose_manifest(answers, asked=6)
    assert why is None and sorted(holders) == sorted(ARMY)
    # the same keys as one listed key's delegates: one vote against two
    holders, why = choose_manifest(answers, asked=3, authorizers=AUTHORIZERS)
    assert why is None and sorted(holders) == sorted(HONEST)
    # the army alone is one voter: not the two a manifest needs
    holders, why = choose_manifest({p: lie for p in ARMY}, asked=3, authorizers=AUTHORIZERS)
    assert holders == [] and why is not None and "vouch" in why


def test_delegates_do_not_outvote_listed_keys_in_the_weights_check() -> None:
    members = [ME, *HONEST, *ARMY]
    honest, lie = model(1), model(2)
    answers = {**{p: honest for p in HONEST}, **{p: lie for p in ARMY}}
    mine = honest.weights_digest()
    found = majority_weights(mine, answers, members, ME, AUTHORIZERS)
    assert found is not None and found[0] == mine  # 3 of 4 voters hold ours
    # an open run: the four keys are 4 of 7 and their weights win
    opened = majority_weights(mine, answers, members, ME)
    assert opened is not None and opened[0] == lie.weights_digest()

"""Bounds on what one member's announcements cost a peer (`p2p.inbox`, `p2p.rate`) and the
late joiner's manifest rule (`p2p.model_share.choose_manifest`, `p2p.manifest` checks)."""

from __future__ import annotations

import json

import pytest
from psyche_client.p2p import inbox as inbox_module
from psyche_client.p2p.announcements import make_finished_announcement, to_wire
from psyche_client.p2p.inbox import AnnouncementInbox
from psyche_client.p2p.manifest import ManifestError, ModelManifest, parameter_info
from psyche_client.p2p.model_share import choose_manifest
from psyche_client.p2p.rate import PeerRates
from psyche_common.protocol import Identity

SENDER = Identity.generate()
PEER_A = b"\x0a" * 32
PEER_B = b"\x0b" * 32


def wire(step: int) -> dict[str, object]:
    """A signed Finished announcement of SENDER for `step`, in wire form."""
    announcement = make_finished_announcement(
        SENDER, step=step, warmup=False, broadcast_merkle=step.to_bytes(32, "big")
    )
    return to_wire(announcement)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_duplicate_is_dropped_before_any_signature_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[object] = []
    real = inbox_module.verify_announcement

    def counting(announcement: object) -> None:
        checks.append(announcement)
        real(announcement)  # type: ignore[arg-type]

    monkeypatch.setattr(inbox_module, "verify_announcement", counting)
    inbox = AnnouncementInbox(lambda _k: True, None, 100)
    assert (await inbox.receive(PEER_A, wire(1))).status == "accepted"
    assert len(checks) == 1
    for _ in range(50):
        assert (await inbox.receive(PEER_B, wire(1))).status == "duplicate"
    assert len(checks) == 1, "a duplicate must cost no signature check"


async def test_a_non_members_announcement_is_refused_before_any_signature_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[object] = []
    monkeypatch.setattr(inbox_module, "verify_announcement", checks.append)
    inbox = AnnouncementInbox(lambda _k: False, None, 100)
    receipt = await inbox.receive(PEER_A, wire(1))
    assert receipt.status == "rejected" and "not a member" in receipt.reason
    assert checks == []


async def test_new_announcements_of_one_peer_are_rated(monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[object] = []
    real = inbox_module.verify_announcement

    def counting(announcement: object) -> None:
        checks.append(announcement)
        real(announcement)  # type: ignore[arg-type]

    monkeypatch.setattr(inbox_module, "verify_announcement", counting)
    clock = Clock()
    inbox = AnnouncementInbox(
        lambda _k: True, None, 1000, rates=PeerRates(rate=2.0, burst=3), clock=clock
    )
    statuses = [(await inbox.receive(PEER_A, wire(step))).status for step in range(10)]
    assert statuses == ["accepted"] * 3 + ["deferred"] * 7
    assert len(checks) == 3, "announcements over the rate cost no signature check"
    # another pusher has its own bucket; a deferred announcement is not remembered
    assert (await inbox.receive(PEER_B, wire(5))).status == "accepted"
    assert (await inbox.receive(PEER_A, wire(3))).status == "deferred"
    clock.now += 1.0  # two more tokens
    assert (await inbox.receive(PEER_A, wire(3))).status == "accepted"
    assert (await inbox.receive(PEER_A, wire(4))).status == "accepted"
    assert (await inbox.receive(PEER_A, wire(6))).status == "deferred"
    # duplicates are free: they never touch the bucket
    assert (await inbox.receive(PEER_A, wire(3))).status == "duplicate"


def test_peer_rates_refill_to_the_burst_and_forget_the_oldest_peer() -> None:
    rates = PeerRates(rate=10.0, burst=2, max_peers=2)
    assert [rates.allow(PEER_A, 0.0) for _ in range(3)] == [True, True, False]
    assert [rates.allow(PEER_A, 100.0) for _ in range(3)] == [True, True, False]
    assert rates.allow(PEER_B, 100.0) and rates.allow(b"\x0c" * 32, 100.0)
    assert rates.allow(PEER_A, 100.0)  # forgotten (2 peers tracked): a full bucket again
    with pytest.raises(ValueError, match="rate > 0"):
        PeerRates(rate=0.0, burst=1)


def model(seed: int, step: int = 7, config: str = '{"hidden_size": 8}') -> ModelManifest:
    data = bytes([seed]) * 64
    return ModelManifest.build(
        step=step,
        epoch=1,
        parameters=[parameter_info("w", "uint8", [64], data)],
        config_json=config,
    )


PEERS = [bytes([i]) * 32 for i in range(1, 6)]


def test_honest_peers_at_different_steps_agree_on_the_same_weights() -> None:
    answers = {PEERS[0]: model(1, step=7), PEERS[1]: model(1, step=8)}
    holders, why = choose_manifest(answers, asked=2)
    assert why is None and sorted(holders) == sorted(PEERS[:2])


def test_a_liar_is_outvoted_and_never_trusted_alone() -> None:
    honest, lie = model(1), model(2)
    holders, why = choose_manifest({PEERS[0]: honest, PEERS[1]: honest, PEERS[2]: lie}, asked=3)
    assert why is None and PEERS[2] not in holders
    # the liar is the only one to answer out of three asked: one voucher is not enough
    holders, why = choose_manifest({PEERS[2]: lie}, asked=3)
    assert holders == [] and why is not None and "only 1 of 3 peers vouch" in why
    # one honest and one liar: no majority (the joiner asks again, then gives up)
    holders, why = choose_manifest({PEERS[0]: honest, PEERS[2]: lie}, asked=2)
    assert holders == [] and why is not None and "no manifest has a majority" in why
    # the same weights with another config are another manifest
    holders, why = choose_manifest(
        {PEERS[0]: honest, PEERS[1]: model(1, config='{"hidden_size": 9}')}, asked=2
    )
    assert holders == [] and why is not None


def test_with_one_other_member_its_manifest_is_all_there_is() -> None:
    holders, why = choose_manifest({PEERS[0]: model(1)}, asked=1)
    assert why is None and holders == [PEERS[0]]
    assert choose_manifest({}, asked=1)[1] == "no peer answered with a model manifest"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "config_json"),
        (json.dumps({"pad": "x" * (1024 * 1024)}), "characters"),
    ],
)
def test_a_manifest_with_an_unusable_config_is_refused_at_decode(config: str, message: str) -> None:
    encoded = model(1, config=config).encode()
    with pytest.raises(ManifestError, match=message):
        ModelManifest.decode(encoded)


def test_a_good_manifest_parses_its_config() -> None:
    decoded = ModelManifest.decode(model(1).encode())
    assert decoded.config() == {"hidden_size": 8}
    assert ModelManifest.decode(model(1, config="").encode()).config() is None

"""A member's announcement floods for the current step (the real P2P inbox in front of the
real round runner): one Finished per sender and step is taken, nothing the round refuses is
forwarded, and forwarded announcements are charged to their signer, not to the forwarder.

Before, every Finished with a distinct Merkle root was new, accepted and forwarded to 8 peers,
so a flooder drained the rate budgets of the honest peers forwarding it, whose own results
then came back "deferred".
"""

from __future__ import annotations

import dataclasses

from psyche_client.p2p.announcements import (
    Announcement,
    make_finished_announcement,
    make_result_announcement,
    to_wire,
)
from psyche_client.p2p.inbox import AnnouncementInbox
from psyche_client.p2p.rate import PeerRates
from psyche_client.round.runner import RoundRunner
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in
from tests.support.rounds import observer_round
from tests.support.runners import lone_runner

STEP = 4
ATTACKER, HONEST, ME = Identity.generate(), Identity.generate(), Identity.generate()
MEMBERS = [ATTACKER.public_key, HONEST.public_key, ME.public_key]
ATTACKERS_BATCH = BatchId(0, 3)
HONEST_BATCH = BatchId(4, 7)


def finished(sender: Identity, step: int, salt: int, warmup: bool = False) -> Announcement:
    return make_finished_announcement(
        sender, step=step, warmup=warmup, broadcast_merkle=salt.to_bytes(32, "big")
    )


def result(sender: Identity, batch: BatchId, salt: int = 0) -> Announcement:
    return make_result_announcement(
        sender,
        run_id="test",  # the run and round seed of `coordinator_in` and `observer_round`
        round_seed=0,
        step=STEP,
        batch_start=batch.start,
        batch_end=batch.end,
        data_hash=salt.to_bytes(32, "big"),
        blob_hash=bytes(32),
        size=8,
    )


def client(rate: float = 1000.0, burst: int = 1000) -> tuple[RoundRunner, AnnouncementInbox]:
    runner = lone_runner(ME)
    runner.ctx.coordinator = coordinator_in(RunState.RoundTrain, MEMBERS, step=STEP)
    runner.ctx.current = observer_round(
        STEP, {ATTACKERS_BATCH: ATTACKER.public_key, HONEST_BATCH: HONEST.public_key}
    )
    inbox = AnnouncementInbox(
        set(MEMBERS).__contains__,
        lambda v, _peer: runner.on_announcement(v),
        max_seen=100_000,
        rates=PeerRates(rate, burst),
        signer_rates=PeerRates(rate, burst),
        clock=lambda: 0.0,
    )
    return runner, inbox


async def push(inbox: AnnouncementInbox, announcement: Announcement, via: bytes) -> str:
    receipt = await inbox.receive(via, to_wire(announcement))
    # only an accepted announcement carries itself back, to be forwarded
    assert (receipt.announcement is not None) == (receipt.status == "accepted")
    return receipt.status


async def test_one_finished_per_sender_and_step_is_taken_and_forwarded() -> None:
    runner, inbox = client()
    flood = [finished(ATTACKER, STEP, salt) for salt in range(200)]
    statuses = [await push(inbox, a, ATTACKER.public_key) for a in flood]
    assert statuses == ["accepted"] + ["rejected"] * 199
    assert await push(inbox, flood[7], ATTACKER.public_key) == "duplicate"  # seen: free
    assert await push(inbox, finished(HONEST, STEP, 1), HONEST.public_key) == "accepted"
    assert runner.ctx.current is not None
    assert runner.ctx.current.finished_from == {ATTACKER.public_key, HONEST.public_key}


async def test_what_the_round_refuses_is_never_forwarded() -> None:
    _runner, inbox = client()
    attacker = ATTACKER.public_key
    # results for a batch that is not its own, for a round already over
    stolen = [result(ATTACKER, HONEST_BATCH, salt) for salt in range(20)]
    assert {await push(inbox, a, attacker) for a in stolen} == {"rejected"}
    old = [finished(ATTACKER, STEP - 2, salt) for salt in range(20)]
    assert {await push(inbox, a, attacker) for a in old} == {"rejected"}
    assert await push(inbox, stolen[0], attacker) == "duplicate"  # seen: a copy costs nothing


async def test_a_warmup_flood_of_invented_tags_is_neither_kept_nor_forwarded() -> None:
    runner, inbox = client()
    runner.ctx.coordinator = coordinator_in(RunState.Warmup, MEMBERS, step=STEP)
    flood = [finished(ATTACKER, STEP, salt, warmup=True) for salt in range(50)]
    statuses = [await push(inbox, a, ATTACKER.public_key) for a in flood]
    assert statuses == ["accepted"] + ["deferred"] * 49
    far = finished(ATTACKER, STEP + 9, 1, warmup=True)
    assert await push(inbox, far, ATTACKER.public_key) == "deferred"


async def test_forwarded_announcements_are_charged_to_their_signer() -> None:
    inbox = AnnouncementInbox(
        set(MEMBERS).__contains__,
        None,
        max_seen=1000,
        rates=PeerRates(0.001, 5),
        signer_rates=PeerRates(0.001, 5),
        clock=lambda: 0.0,
    )
    forwarder = HONEST.public_key
    # the attacker's announcements reach us through an honest peer
    relayed = [finished(ATTACKER, step, 0) for step in range(100, 108)]
    statuses = [await push(inbox, a, forwarder) for a in relayed]
    assert statuses == ["accepted"] * 5 + ["deferred"] * 3  # the signer's budget ran out
    # the forwarder's own budget is whole: its announcements are still taken
    honest = [finished(HONEST, step, 0) for step in range(200, 205)]
    assert [await push(inbox, a, forwarder) for a in honest] == ["accepted"] * 5
    # a peer pushing forgeries pays for them itself; the signer they name pays nothing
    forged = dataclasses.replace(finished(ME, 300, 0), envelope_signature=b"\x00" * 64)
    statuses = [await push(inbox, forged, ATTACKER.public_key) for _ in range(7)]
    assert statuses == ["rejected"] * 5 + ["deferred"] * 2
    assert await push(inbox, finished(ME, 301, 0), ME.public_key) == "accepted"

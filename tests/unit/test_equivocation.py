"""Equivocation (docs/security.md findings 2 and 3), in process: the real P2P inbox, the real
round exchange, `plan_apply` and the apply step, and the real coordinator.

A trainer that signs two commitments for one batch and tells each half of the clients a
different one must not leave them with different weights: every inbox keeps and forwards the
second commitment, the clients report the pair to the coordinator, which drops the trainer, and
every client then skips the batch, whichever commitment it saw first.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from psyche_client.p2p.announcements import (
    ResultAnnouncement,
    make_result_announcement,
    proof_of,
    to_wire,
)
from psyche_client.p2p.inbox import AnnouncementInbox
from psyche_client.round.consensus import (
    ApplyPlan,
    SkipReason,
    commitment_threshold,
    plan_apply,
    split_convicted,
)
from psyche_client.round.roles import RoundRoles
from psyche_client.round.runner import RoundRunner
from psyche_client.round.state import RoundState
from psyche_client.training.backend import DummyBackend, DummyResult, result_commitment
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.coordinator import ClientState, Coordinator, RunState, Witness, witness_quorum
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.committee import CommitteeSelection, WitnessProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.coordinator.errors import CoordinatorError
from psyche_common.coordinator.health import participant_key
from psyche_common.protocol import Identity, verify_signature

from tests.support.coordinators import coordinator_in
from tests.support.fakes import RecordingUplink
from tests.support.rounds import downloaded
from tests.support.runners import lone_runner

STEP = 4
BATCH = BatchId(0, 3)
TRAINER = Identity.generate()
SEED = 7
"""The round seed of STEP in `coordinator_in`'s runs (its default tick seed)."""


def signed(data: bytes, blob: bytes, trainer: Identity = TRAINER) -> ResultAnnouncement:
    """`trainer`'s signed result for BATCH of STEP: payload `data`, served as blob `blob`."""
    return make_result_announcement(
        trainer,
        run_id="test",
        round_seed=SEED,
        step=STEP,
        batch_start=BATCH.start,
        batch_end=BATCH.end,
        data_hash=result_commitment(STEP, BATCH, data),
        blob_hash=hashlib.sha256(blob).digest(),
        size=DummyBackend.PAYLOAD_SIZE,
    )


@dataclass
class Node:
    """One honest client: its runner (in round STEP, where TRAINER trains BATCH) behind a
    real announcement inbox."""

    runner: RoundRunner
    uplink: RecordingUplink
    inbox: AnnouncementInbox
    round_: RoundState

    @property
    def me(self) -> bytes:
        return self.runner.ctx.me

    async def receive(self, announcement: ResultAnnouncement, via: bytes) -> ResultAnnouncement:
        receipt = await self.inbox.receive(via, to_wire(announcement))
        assert receipt.status in ("accepted", "rejected"), receipt
        return announcement

    def close(self) -> None:
        for download in self.round_.downloads.values():
            if download.task is not None:
                download.task.cancel()


def round_of(members: Sequence[bytes]) -> Coordinator:
    """The coordinator in round STEP; every member trains a batch of BATCH's size."""
    size = len(BATCH) * len(members)
    return coordinator_in(
        RunState.RoundTrain,
        list(members),
        step=STEP,
        seed=SEED,
        global_batch_size_start=size,
        global_batch_size_end=size,
    )


def make_node(members: Sequence[bytes], me: Identity) -> Node:
    uplink = RecordingUplink(me.public_key)
    runner = lone_runner(me, uplink)
    runner.ctx.coordinator = round_of(members)
    ids = runner.ctx.members()
    roles = RoundRoles(
        step=STEP,
        height=1,
        my_index=ids.index(me.public_key),
        committee_proof=None,
        witness_proof=None,
        selection=CommitteeSelection.new(0, 1, 0, len(ids), 7),  # every member trains
        assignments={BATCH: TRAINER.public_key},
        batch_ids=(BATCH,),
        my_batches=(),
        random_seed=SEED,
    )
    round_ = RoundState.start(roles, len(ids), True, 0.0, bloom_factory=lambda n: Bloom.random())
    runner.ctx.current = round_
    inbox = AnnouncementInbox(
        set(ids).__contains__, lambda v, _peer: runner.on_announcement(v), max_seen=1000
    )
    return Node(runner, uplink, inbox, round_)


def honest_nodes(count: int) -> list[Node]:
    """`count` honest nodes whose coordinator really assigns BATCH to TRAINER (an equivocation
    proof is about an assigned batch)."""
    identities = [Identity.generate() for _ in range(count)]
    members = [TRAINER.public_key, *(i.public_key for i in identities)]
    # The trainer order is a shuffle of client positions by the round seed (not by the keys), so
    # it is the trainer's place in the member list that decides which batch it gets.
    for order in itertools.permutations(members):
        if assign_data_for_state(round_of(order)).get(BATCH) == TRAINER.public_key:
            return [make_node(order, identity) for identity in identities]
    raise AssertionError(f"no order of {count + 1} members assigns {BATCH} to the trainer")


def bloom_of(*items: bytes) -> Bloom:
    bloom = Bloom.random()
    for item in items:
        bloom.add(item)
    return bloom


def plan_of(node: Node, blooms: Sequence[Bloom]) -> ApplyPlan[BatchId]:
    quorum = witness_quorum(0, len(blooms))
    return plan_apply(
        [BATCH], node.round_.candidates, blooms, commitment_threshold(quorum, len(blooms))
    )


async def test_two_halves_told_different_commitments_hold_the_same_candidates() -> None:
    """Finding 2: the inbox refused a second commitment without forwarding it, so S1 kept
    [A] and S2 [B]; with the witnesses split 2/2, S1 applied A and S2 applied B."""
    s1, s2 = honest_nodes(2)
    try:
        a, b = signed(b"A" * 64, b"blob-a"), signed(b"B" * 64, b"blob-b")
        await s1.receive(a, TRAINER.public_key)
        await s2.receive(b, TRAINER.public_key)
        # gossip: each forwards what it accepted to the other
        await s2.receive(a, s1.me)
        await s1.receive(b, s2.me)
        assert sorted(s1.round_.candidates[BATCH], key=lambda c: c.commitment) == sorted(
            s2.round_.candidates[BATCH], key=lambda c: c.commitment
        )
        blooms = [bloom_of(a.commitment)] * 2 + [bloom_of(b.commitment)] * 2
        assert plan_of(s1, blooms) == plan_of(s2, blooms)
        # two commitments of one batch can never both reach the threshold: nobody applies
        assert plan_of(s1, blooms).skipped == [(BATCH, SkipReason.NO_QUORUM)]
        await asyncio.sleep(0)  # the reports are sent by tasks
        assert len(s1.uplink.equivocations) == 1 and len(s2.uplink.equivocations) == 1
    finally:
        s1.close()
        s2.close()


async def test_an_equivocation_proof_drops_the_trainer_and_every_client_skips_it() -> None:
    s1, s2 = honest_nodes(2)
    try:
        a, b = signed(b"A" * 64, b"blob-a"), signed(b"B" * 64, b"blob-b")
        await s1.receive(a, TRAINER.public_key)
        await s1.receive(b, s2.me)
        await s2.receive(b, TRAINER.public_key)  # S2 never hears of A
        await asyncio.sleep(0)
        (proof,) = s1.uplink.equivocations
        coordinator = s1.runner.ctx.coordinator
        assert coordinator is not None
        reporter = s1.me
        received = EquivocationProof.from_wire(proof.to_wire())
        recorded = coordinator.equivocation(reporter, received, verify_signature)
        assert recorded is not None and recorded.trainer == TRAINER.public_key
        assert recorded.proven and recorded.verifiers == (reporter,)
        # proven during RoundTrain of STEP: STEP - 1's results are not final yet either
        assert recorded.step == STEP - 1
        assert coordinator.equivocation(reporter, proof, verify_signature) is None  # once per epoch
        trainer = next(c for c in coordinator.epoch_state.clients if c.id == TRAINER.public_key)
        assert trainer.state == ClientState.Dropped
        record, epoch = coordinator.verification, coordinator.progress.epoch
        blooms = [bloom_of(a.commitment)] * 3 + [bloom_of(b.commitment)]
        for node in (s1, s2):  # whichever commitments each one saw
            plan = split_convicted(
                plan_of(node, blooms),
                {BATCH: TRAINER.public_key},
                lambda t: record.excluded(t, epoch, STEP),
                SkipReason.EQUIVOCATED,
            )
            assert plan.apply == [] and plan.skipped == [(BATCH, SkipReason.EQUIVOCATED)]
        # the record travels with the coordinator, and the key is not admitted again
        assert Coordinator.from_wire(coordinator.to_wire()).verification.excluded(
            TRAINER.public_key, epoch, STEP
        )
        assert record.banned(TRAINER.public_key, epoch + 5)
    finally:
        s1.close()
        s2.close()


async def test_the_same_data_hash_with_two_blobs_is_two_commitments() -> None:
    """Finding 3: the inbox took a second blob for one data hash, and the download (keyed by
    the data hash) never tried the good blob: its victims lost sync every round."""
    (node,) = honest_nodes(1)
    try:
        good, junk = signed(b"A" * 64, b"good blob"), signed(b"A" * 64, b"junk blob")
        assert good.data_hash == junk.data_hash and good.commitment != junk.commitment
        await node.receive(junk, TRAINER.public_key)
        await node.receive(good, TRAINER.public_key)
        assert set(node.round_.downloads) == {good.commitment, junk.commitment}
        await asyncio.sleep(0)
        (proof,) = node.uplink.equivocations
        proof.check(verify_signature)  # self-proving: both signatures, one batch, two statements
    finally:
        node.close()


def test_a_trainer_nonce_outside_the_commitment_is_inside_it_now() -> None:
    """Finding 3: the nonce sits outside the DisTrO data hash, so one half could skip a
    result as cold start while the other applied it. The blob holds the nonce, and the signed
    commitment names the blob."""
    from tests.support.tiny_distro import SETTINGS, generate_result

    _, generated = generate_result(SETTINGS, step=STEP, start=BATCH.start)
    result = generated.transmit
    renonced = type(result)(
        result.step, result.batch_id, result.trainer_nonce + 1, result.value_kind, result.tensors
    )
    assert renonced.data_hash() == result.data_hash()

    def announce(blob: bytes) -> ResultAnnouncement:
        return make_result_announcement(
            TRAINER,
            run_id="test",
            round_seed=0,
            step=STEP,
            batch_start=result.batch_id.start,
            batch_end=result.batch_id.end,
            data_hash=result.data_hash(),
            blob_hash=hashlib.sha256(blob).digest(),
            size=len(blob),
        )

    first, second = announce(result.encode()), announce(renonced.encode())
    assert first.commitment != second.commitment
    proof_of(first, second).check(verify_signature)


def test_a_proof_that_proves_nothing_is_refused() -> None:
    coordinator = coordinator_in(RunState.RoundTrain, [TRAINER.public_key, bytes(32)], step=STEP)
    a, b = signed(b"A" * 64, b"blob-a"), signed(b"B" * 64, b"blob-b")
    other_batch = make_result_announcement(
        TRAINER,
        run_id="test",
        round_seed=SEED,
        step=STEP,
        batch_start=4,
        batch_end=7,
        data_hash=a.data_hash,
        blob_hash=a.blob_hash,
        size=a.size,
    )
    stranger = signed(b"B" * 64, b"blob-b", trainer=Identity.generate())
    forged = proof_of(a, b)
    forged = EquivocationProof(
        forged.first,
        type(forged.second)(**{**vars(forged.second), "signature": forged.first.signature}),
    )
    for proof, why in (
        (proof_of(a, a), "the same"),
        (proof_of(a, other_batch), "different batches"),
        (proof_of(a, stranger), "different trainers"),
        (forged, "second.signature does not verify"),
    ):
        with pytest.raises(CoordinatorError, match=why):
            coordinator.equivocation(bytes(32), proof, verify_signature)
    assert coordinator.verification.convictions == []


def witnesses_seeing(owner: bytes, *commitments: bytes) -> list[Witness]:
    """One witness per commitment; each saw `owner` deliver that commitment."""
    witnesses = []
    for index, commitment in enumerate(commitments):
        participants = bloom_of(participant_key(owner))
        witnesses.append(
            Witness(WitnessProof(index, index, True), participants, bloom_of(commitment))
        )
    return witnesses


async def test_a_node_that_never_heard_of_the_winner_resyncs_instead_of_skipping() -> None:
    """A proof that came too late (the step was final) leaves the quorum to decide: the
    nodes that know the winning commitment apply it, one that knows only the other is out of
    sync (before, it skipped the batch as NO_QUORUM and its weights silently differed)."""
    s1, s3 = honest_nodes(2)
    try:
        a, b = signed(b"A" * 64, b"blob-a"), signed(b"B" * 64, b"blob-b")
        await s1.receive(a, TRAINER.public_key)
        await s3.receive(b, TRAINER.public_key)
        coordinator = coordinator_in(
            RunState.RoundTrain, s1.runner.ctx.members(), step=STEP + 2, witness_nodes=0
        )
        witnesses = witnesses_seeing(TRAINER.public_key, *[a.commitment] * 3, b.commitment)
        payload = DummyResult(b"A" * 64)
        s1.round_.downloads[a.commitment] = downloaded(
            a.data_hash, TRAINER.public_key, BATCH, payload
        )
        assert await s1.runner.applier.apply(s1.round_, witnesses, coordinator, STEP + 2)
        assert s1.runner.ctx.out_of_sync is None
        assert await s3.runner.applier.apply(s3.round_, witnesses, coordinator, STEP + 2) is None
        assert "never heard of" in (s3.runner.ctx.out_of_sync or "")
    finally:
        s1.close()
        s3.close()


async def test_a_batch_whose_commitment_the_witnesses_did_not_carry_is_skipped_quietly() -> None:
    """A witness that marks the trainer seen but holds none of its commitments is no
    evidence of a result this node lacks: one such witness is below the threshold."""
    (node,) = honest_nodes(1)
    try:
        a = signed(b"A" * 64, b"blob-a")
        await node.receive(a, TRAINER.public_key)
        coordinator = coordinator_in(
            RunState.RoundTrain, node.runner.ctx.members(), step=STEP + 2, witness_nodes=0
        )
        # two witnesses saw A, a third claims the trainer but carries no commitment of it
        witnesses = witnesses_seeing(TRAINER.public_key, a.commitment, a.commitment, bytes(32))
        witnesses += witnesses_seeing(bytes(32), bytes(32))  # a fourth saw nothing of it
        assert await node.runner.applier.apply(node.round_, witnesses, coordinator, STEP + 2)
        assert node.runner.ctx.out_of_sync is None
    finally:
        node.close()

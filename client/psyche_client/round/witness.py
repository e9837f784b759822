"""Witnessing (reference §2.7, §2.8, §2.10): Finished, the round witness, health checks.

During a round, once our training is done and every result of the previous round is settled,
we announce Finished (with the Merkle root of what we saw); a witness of the round then sends
its witness (the previous round's blooms) as soon as every member has finished, or at the
latest when the coordinator enters RoundWitness. At the start of a round, a witness of the
previous round accuses the trainers that too few witnesses saw participating (which ones: its
`AccusationPolicy`, by default `health.clients_to_accuse`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from psyche_common.bloom import Bloom
from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator, shares, witness_quorum
from psyche_common.coordinator.committee import Committee
from psyche_common.coordinator.types import Witness
from psyche_common.coordinator.witnesses import attested_trainers
from psyche_common.protocol.messages import WitnessMetadata

from psyche_client.p2p.announcements import make_finished_announcement
from psyche_client.p2p.inbox import VerifiedAnnouncement
from psyche_client.round.context import RoundContext
from psyche_client.round.exchange import ResultExchange
from psyche_client.round.health import AccusationPolicy, clients_to_accuse
from psyche_client.round.phase import Phase
from psyche_client.round.ports import PeerNetwork, Uplink
from psyche_client.round.roles import selection_for_round
from psyche_client.round.state import RoundStage, RoundState
from psyche_client.round.witness_builder import EMPTY_MERKLE_ROOT

log = logging.getLogger("psyche.client")


class Witnessing:
    def __init__(
        self,
        ctx: RoundContext,
        network: PeerNetwork,
        uplink: Uplink,
        exchange: ResultExchange,
        accuse: AccusationPolicy = clients_to_accuse,
    ) -> None:
        self.ctx = ctx
        self.network = network
        self.uplink = uplink
        self.exchange = exchange
        self.accuse = accuse

    async def progress(self) -> None:
        """Send Finished and the opportunistic witness once their conditions hold."""
        round_ = self.ctx.current
        if round_ is None or self.ctx.phase != Phase.TRAINING:
            return
        if round_.stage not in (RoundStage.TRAINED, RoundStage.FINISHED):
            return
        if self.ctx.out_of_sync is not None:
            return
        previous = self.ctx.previous
        if previous is not None and not (
            previous.witness.all_batches_seen and previous.downloads_settled()
        ):
            return
        if round_.stage is RoundStage.TRAINED:
            round_.mark_finished()
            merkle = previous.witness.merkle() if previous is not None else EMPTY_MERKLE_ROOT
            announcement = make_finished_announcement(
                self.ctx.identity, step=round_.step, warmup=False, broadcast_merkle=merkle
            )
            round_.own_announcements.append(announcement)
            self.exchange.route(VerifiedAnnouncement.own(announcement))
            await self.network.announce(announcement)
        if set(self.ctx.members()) <= round_.finished_from and round_.roles.is_witness:
            await self.send_witness(round_, fallback=False)

    async def send_witness(self, round_: RoundState, fallback: bool) -> None:
        """Send this round's witness (it attests the previous round's results) at most once."""
        proof = round_.roles.witness_proof
        if proof is None or not round_.roles.is_witness or round_.sent_witness:
            return
        if self.ctx.out_of_sync is not None:
            return  # what we saw may not be what the others saw
        round_.sent_witness = True
        previous = self.ctx.previous
        timings: list[int] = []
        if previous is not None:
            participant = previous.witness.participant_bloom
            broadcast = previous.witness.broadcast_bloom
            merkle = previous.witness.merkle()
            coordinator = self.ctx.coordinator
            if coordinator is not None and coordinator.config.per_client_shares:
                timings = previous.witness.timings(previous.roles.batch_ids)
        else:
            participant, broadcast, merkle = Bloom(), Bloom(), EMPTY_MERKLE_ROOT
        weights = self.ctx.require_backend().weights_hash()
        metadata = self.ctx.stats.witness_metadata(round_.step, weights)
        await self.uplink.send_witness(
            Witness(proof, participant, broadcast, merkle, timings), WitnessMetadata(**metadata)
        )
        if fallback:  # the round ran to its end: say what the witness was still waiting for
            waiting_for = sorted(
                short_id(m) for m in self.ctx.members() if m not in round_.finished_from
            )
            unseen = (
                sorted(str(b) for b in (previous.witness.remaining_batches or ()))
                if (previous is not None)
                else []
            )
            pending = sum(not d.settled for d in previous.downloads.values()) if previous else 0
            log.info(
                "sent witness at the end of the round: no Finished from %s",
                waiting_for or "nobody missing",
                extra=self.ctx.fields(
                    fallback=True,
                    waiting_for=waiting_for,
                    trained=round_.training_done,
                    previous_batches_unseen=unseen,
                    previous_downloads_pending=pending,
                ),
            )
            return
        log.info("sent witness", extra=self.ctx.fields(fallback=fallback))

    async def send_health_checks(
        self, coordinator: Coordinator, after: Awaitable[object] | None = None
    ) -> None:
        """As a witness of the previous round: accuse its trainers that too few witnesses
        saw participating — once the round's apply (`after`) showed we are in sync."""
        if after is not None:
            await asyncio.shield(after)  # shared with the training task: never cancel it here
        if self.ctx.out_of_sync is not None:
            return
        previous_round = coordinator.previous_round()
        selection = selection_for_round(coordinator, previous_round)
        if previous_round is None or selection is None or coordinator.current_round().height < 2:
            return
        attested = attested_trainers(coordinator)  # who had a result the blooms could hold
        if previous_round.clients_len != len(coordinator.epoch_state.clients) or (
            attested is None and coordinator.config.verification_percent > 0
        ):
            # members left at this round's start (a drop or a conviction): committee indices
            # of the previous round no longer name the same clients, and an accusation built
            # from them could name an honest member (docs/verification.md)
            log.info(
                "health check skipped: the members changed since the previous round",
                extra=self.ctx.fields(),
            )
            return
        witnesses = list(previous_round.witnesses)
        quorum = witness_quorum(coordinator.config.witness_nodes, len(witnesses))
        ids = [c.id for c in coordinator.epoch_state.clients][: selection.total_nodes]

        def judged(i: int) -> bool:
            trainer = selection.get_committee(i).committee == Committee.Trainer
            due = attested is None or ids[i] in attested
            return trainer and due and not shares.forgiven(coordinator, ids[i])

        accused = self.accuse(
            ids,
            is_trainer=judged,
            participant_blooms=[w.participant_bloom for w in witnesses],
            quorum=quorum,
            proof_for=selection.get_committee,
        )
        if accused:
            log.warning(
                "health check: accusing %s",
                [short_id(client_id) for client_id, _ in accused],
                extra=self.ctx.fields(),
            )
            await self.uplink.send_health_check(
                accused, coordinator.progress.step, self.ctx.require_backend().weights_hash()
            )

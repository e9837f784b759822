"""Apply, witness and health parts of the round pipeline (reference §2.7–2.10).

At the start of round h: apply round h−2's consensus results and report the weights hash,
and (as a witness of round h−1) accuse the trainers below the participant quorum. During the
round: send Finished once training is done and every result of round h−1 is verified, then
the (opportunistic) witness once every client has finished.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from psyche_common.bloom import Bloom
from psyche_common.client_id import short_id
from psyche_common.committee import Committee
from psyche_common.coordinator.quorum import witness_quorum

from psyche_client.p2p.announcements import (
    make_finished_announcement,
)
from psyche_client.round.base import RunnerBase
from psyche_client.round.consensus import plan_apply
from psyche_client.round.health import clients_to_accuse
from psyche_client.round.ports import DesyncError, witness_wire
from psyche_client.round.roles import selection_for_round
from psyche_client.round.state import RoundState
from psyche_client.round.witness_builder import EMPTY_MERKLE_ROOT

log = logging.getLogger("psyche.client")


class ApplyAndWitness(RunnerBase):
    """Apply, Finished, witness and health checks; mixed into `RoundRunner`."""

    async def _apply(self, source: RoundState, coordinator: Any, step: int) -> None:
        assert self.backend is not None
        previous_round = coordinator.previous_round()
        witnesses = list(previous_round.witnesses) if previous_round is not None else []
        quorum = witness_quorum(coordinator.config.witness_nodes, len(witnesses))
        plan = plan_apply(
            source.roles.batch_ids,
            source.candidates,
            [w.broadcast_bloom for w in witnesses],
            quorum,
        )
        for batch, reason in plan.skipped:
            log.warning(
                "not applying %s of step %d: %s",
                batch,
                source.step,
                reason.value,
                extra=self._fields(),
            )
        results = []
        cold_start_steps = _cold_start_filter(coordinator)
        for batch, candidate in plan.apply:
            task = source.downloads.get(candidate.data_hash)
            if task is not None and not task.done():
                await asyncio.shield(task)
            payload = source.payloads.get(candidate.data_hash)
            if payload is None:
                raise DesyncError(
                    f"the consensus result for {batch} of step {source.step} (from "
                    f"{short_id(candidate.sender)}) could not be downloaded and verified; "
                    "this client's weights would differ from its peers'"
                )
            nonce = getattr(payload, "trainer_nonce", None)
            if nonce is not None and nonce < cold_start_steps:
                log.info(
                    "not applying %s of step %d: its trainer is in its cold start (nonce %d < %d)",
                    batch,
                    source.step,
                    nonce,
                    cold_start_steps,
                    extra=self._fields(),
                )
                continue
            results.append(payload)
            self.stats.applied_senders.add(candidate.sender)
        if results:
            async with self._model_lock:
                await asyncio.to_thread(self.backend.apply, step, results)
        else:
            log.warning("no results to apply for step %d", source.step, extra=self._fields())
        weights = self.backend.weights_hash()
        self.stats.applied(step, weights)
        log.info(
            "applied step",
            extra=self._fields(
                step=step,
                applied_from_step=source.step,
                results=len(results),
                weights_hash=weights.hex(),
            ),
        )
        await self.uplink.send_health_check([], step, weights)

    async def _send_health_checks(self, coordinator: Any) -> None:
        """As a witness of the previous round: accuse its trainers that too few witnesses
        saw participating."""
        previous_round = coordinator.previous_round()
        selection = selection_for_round(coordinator, previous_round)
        if previous_round is None or selection is None or coordinator.current_round().height < 2:
            return
        witnesses = list(previous_round.witnesses)
        quorum = witness_quorum(coordinator.config.witness_nodes, len(witnesses))
        ids = [c.id for c in coordinator.epoch_state.clients][: selection.total_nodes]
        accused = clients_to_accuse(
            ids,
            is_trainer=lambda i: selection.get_committee(i).committee == Committee.Trainer,
            participant_blooms=[w.participant_bloom for w in witnesses],
            quorum=quorum,
            proof_for=lambda i: selection.get_committee(i).to_wire(),
        )
        if accused:
            assert self.backend is not None
            log.warning(
                "health check: accusing %s",
                [short_id(client_id) for client_id, _ in accused],
                extra=self._fields(),
            )
            await self.uplink.send_health_check(
                accused, coordinator.progress.step, self.backend.weights_hash()
            )

    async def _send_witness(self, round_: RoundState, fallback: bool) -> None:
        """Send this round's witness (it attests the previous round's results) at most once."""
        proof = round_.roles.witness_proof
        if proof is None or not round_.roles.is_witness or round_.sent_witness:
            return
        round_.sent_witness = True
        previous = self.previous
        if previous is not None:
            participant = previous.witness.participant_bloom
            broadcast = previous.witness.broadcast_bloom
            merkle = previous.witness.merkle()
        else:
            participant, broadcast, merkle = Bloom(), Bloom(), EMPTY_MERKLE_ROOT
        assert self.backend is not None
        metadata = self.stats.witness_metadata(round_.step, self.backend.weights_hash())
        await self.uplink.send_witness(
            witness_wire(proof, participant, broadcast, merkle), metadata
        )
        log.info("sent witness", extra=self._fields(fallback=fallback))

    def _poke(self) -> None:
        """Something the Finished/witness conditions depend on changed: check them now rather
        than at the next 500 ms tick (saves up to half a second per round)."""
        if self.active == "training":
            self._spawn(self._training_tick())

    async def _training_tick(self) -> None:
        round_ = self.current
        if round_ is None or self.active != "training" or not round_.training_done:
            return
        previous = self.previous
        if previous is not None and not (
            previous.witness.all_batches_seen and previous.downloads_settled()
        ):
            return
        if not round_.sent_finished:
            round_.sent_finished = True
            merkle = previous.witness.merkle() if previous is not None else EMPTY_MERKLE_ROOT
            announcement = make_finished_announcement(
                self.identity, step=round_.step, warmup=False, broadcast_merkle=merkle
            )
            round_.own_announcements.append(announcement)
            self._route(announcement)
            await self.network.announce(announcement)
        if set(self._client_ids()) <= round_.finished_from and round_.roles.is_witness:
            await self._send_witness(round_, fallback=False)


def _cold_start_filter(coordinator: Any) -> int:
    """Results whose trainer nonce is below this are skipped (P2P checkpoints only, §2.9)."""
    checkpoint = coordinator.model.checkpoint
    if getattr(checkpoint, "kind", "") in ("P2P", "P2PGcs"):
        return int(coordinator.model.cold_start_warmup_steps)
    return 0

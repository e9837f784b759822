"""Applying a round's consensus results to the model (reference §2.9).

The results of round h−2 are applied once round h−1's witnesses are final: for every batch,
the one commitment a witness quorum saw (`plan_apply`, `commitment_threshold`), in batch-id
order, minus the results of trainers still in their cold start (`split_cold_start`), of
trainers the coordinator holds proof of equivocation against and of trainers the verifiers
convicted, for that step or earlier, and the results the coordinator refused on standing
accusations (`split_convicted`). A consensus result that this client could not download and
verify, or one it never heard of (`missed_results`), puts it out of sync
(`RoundContext.lose_sync`): applying anything else would leave its weights different from its
peers'; the next Warmup resyncs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator, Witness, witness_quorum
from psyche_common.coordinator.health import health_score

from psyche_client.round.consensus import (
    SkipReason,
    cold_start_steps,
    commitment_threshold,
    plan_apply,
    split_cold_start,
    split_convicted,
)
from psyche_client.round.context import RoundContext
from psyche_client.round.link_speed import link_verdict, mbit
from psyche_client.round.ports import Uplink
from psyche_client.round.state import RoundState
from psyche_client.training.backend import DecodedResult

log = logging.getLogger("psyche.client")


def missed_results(
    skipped: Sequence[tuple[BatchId, SkipReason]],
    source: RoundState,
    witnesses: Sequence[Witness],
    threshold: int,
) -> list[BatchId]:
    """Batches skipped for want of a result (none known, or none of ours with enough votes)
    although `threshold` witnesses saw their trainer deliver one (its participant bloom) that
    is none of the commitments we know (their broadcast blooms hold none of ours): a result
    we never heard of may have won, and applying without it would leave our weights different
    from everyone's."""
    missed = []
    for batch, reason in skipped:
        owner = source.roles.assignments.get(batch)
        if reason not in (SkipReason.NO_COMMITMENT, SkipReason.NO_QUORUM) or owner is None:
            continue
        known = [candidate.commitment for candidate in source.candidates.get(batch, ())]
        unknown_votes = sum(
            1
            for witness in witnesses
            if health_score(owner, [witness.participant_bloom]) > 0
            and not any(witness.broadcast_bloom.contains(c) for c in known)
        )
        if unknown_votes >= threshold:
            missed.append(batch)
    return missed


class ApplyStep:
    def __init__(self, ctx: RoundContext, uplink: Uplink) -> None:
        self.ctx = ctx
        self.uplink = uplink
        self._link_warned: int | None = None
        """The step whose too-slow verdict was logged last (an apply done early for a
        prepared round and then redone judges the same round twice)."""

    async def apply(
        self,
        source: RoundState,
        witnesses: Sequence[Witness],
        coordinator: Coordinator,
        step: int,
    ) -> bytes | None:
        """Apply `source`'s consensus results as the update of `step`; returns the weights
        hash after it. Waits for the downloads the consensus needs. When a consensus result
        cannot be had, nothing is applied: the client is out of sync (None)."""
        backend = self.ctx.require_backend()
        threshold = commitment_threshold(
            witness_quorum(coordinator.config.witness_nodes, len(witnesses)), len(witnesses)
        )
        plan = plan_apply(
            source.roles.batch_ids,
            source.candidates,
            [witness.broadcast_bloom for witness in witnesses],
            threshold,
        )
        # convictions (on proof of equivocation, or by verifiers) for this step are final once
        # the next round's witnesses are in (later ones name later steps): every client skips
        # the same results
        epoch = coordinator.progress.epoch
        record = coordinator.verification
        plan = split_convicted(
            plan,
            source.roles.assignments,
            lambda trainer: any(
                c.proven and c.trainer == trainer and c.epoch == epoch and c.step <= source.step
                for c in record.convictions
            ),
            SkipReason.EQUIVOCATED,
        )
        plan = split_convicted(
            plan,
            source.roles.assignments,
            lambda trainer: record.excluded(trainer, epoch, source.step),
        )
        plan = split_convicted(
            plan,
            source.roles.assignments,
            lambda trainer: record.refused_at(trainer, source.step),
            SkipReason.REFUSED,
        )
        missed = missed_results(plan.skipped, source, witnesses, threshold)
        if missed:
            self.ctx.lose_sync(
                f"the witnesses saw results of step {source.step} this client never heard "
                f"of (batches {', '.join(str(batch) for batch in missed)})"
            )
            return None
        chosen: list[tuple[tuple[BatchId, bytes], DecodedResult]] = []
        try:
            for batch, candidate in plan.apply:
                download = source.downloads.get(candidate.commitment)
                task = download.task if download is not None else None
                if task is not None and not task.done():
                    await asyncio.shield(task)
                if download is None or download.result is None:
                    self.ctx.lose_sync(
                        f"the consensus result for {batch} of step {source.step} (from "
                        f"{short_id(candidate.sender)}) could not be downloaded and verified"
                    )
                    return None
                chosen.append(((batch, candidate.sender), download.result))
        finally:  # also when a result came too late: a slow link is the likely cause
            self._check_link(source, coordinator)
        model = coordinator.model
        kept, cold = split_cold_start(
            chosen, cold_start_steps(model.checkpoint.is_p2p, model.cold_start_warmup_steps)
        )
        skipped = [*plan.skipped, *((batch, reason) for (batch, _), reason in cold)]
        for skipped_batch, reason in skipped:
            log.warning(
                "not applying %s of step %d: %s",
                skipped_batch,
                source.step,
                reason.value,
                extra=self.ctx.fields(),
            )
        self.ctx.stats.applied_senders.update(sender for (_, sender), _ in kept)
        results = [result for _, result in kept]
        # a mid-epoch joiner applies onto the members' snapshot only (`round.joiner`)
        await self.ctx.weights_ready.wait()
        if results:
            async with self.ctx.model_lock:
                await asyncio.to_thread(backend.apply, step, results)
        else:
            log.warning("no results to apply for step %d", source.step, extra=self.ctx.fields())
        self.ctx.stats.results_applied(step, len(results))
        weights = backend.weights_hash()
        log.info(
            "applied step",
            extra=self.ctx.fields(
                step=step,
                applied_from_step=source.step,
                results=len(results),
                senders=sorted(short_id(sender) for (_, sender), _ in kept),
                weights_hash=weights.hex(),
            ),
        )
        return weights

    def _check_link(self, source: RoundState, coordinator: Coordinator) -> None:
        """Warn when `source`'s results arrived too slowly for the round time."""
        if source.fetches.transfers == 0:
            return  # nothing fetched: nothing measured
        round_time = float(coordinator.config.max_round_train_time)
        verdict = link_verdict(source, self.ctx.me, round_time)
        if verdict is None:
            return
        self.ctx.stats.link_status = verdict.summary()
        if verdict.too_slow and verdict.step != self._link_warned:
            self._link_warned = verdict.step
            log.warning(
                "%s",
                verdict.describe(),
                extra=self.ctx.fields(
                    link_mbps=round(mbit(verdict.rate), 3),
                    needed_mbps=round(mbit(verdict.needed_rate), 3),
                    results_seconds=round(verdict.projected, 2),
                    round_time=round_time,
                ),
            )

    async def report(self, step: int, weights: bytes) -> None:
        """Tell the coordinator our weights after `step`'s update (it flags outliers)."""
        if not self.ctx.weights_ready.is_set():
            return  # a joiner before its snapshot: its weights are no evidence of anything
        self.ctx.stats.applied(step, weights)
        await self.uplink.send_health_check([], step, weights)

"""The verifier stage: recompute a sample of the round's batches, score the trainers' results.

A client whose committee is `Verifier` in round h trains nothing. Once the apply before round
h is done (the weights every trainer of round h starts from), it fetches the samples of every
batch of the round and, under the model lock, recomputes each batch's reference
(`ResultVerifier.recompute`: the DCT of the plain gradient at the point the batch's trainer
trained at, its lookahead along its own published result of the step before when it trained
that step: `_lookahead_of`, `distro.lookahead`; weights unchanged after). Which of them
it checks (`verifier_sample`: its group's, from the round's sample seed) is known only when
the coordinator reveals the seed, at the round's RoundWitness, after the trainers published
and possibly after the weights moved on, so it recomputes them all first and keeps its sample's
once the seed is out (`check_rounds`). Every verified result announced for those batches is
then scored
(`score_result`: its agreement with its batch, its margin over the sample's other batch, its
top-k overlap with every result of another trainer announced before it) once those earlier
results have settled, or once it has waited `EARLIER_WAIT` seconds for them (then against the
earlier results verified by then: a trainer that serves its blob a byte at a time delays the
round's checks by that much, never blinds them), and reported to the coordinator, once per
batch: a failed check
(`checks.failure`) as an accusation (`Uplink.send_accusation`), any other as an
attestation (`Uplink.send_attestation`), both naming the commitment scored. The coordinator
convicts when independent verifiers agree and removes accusers that others refute.

Nothing here changes what the client applies: the coordinator's record of convictions does,
the same way for every client (`ApplyStep`). If the weights move during the recomputes (the
next round's early apply ran first), the batches not yet recomputed are not checked rather
than checked on wrong weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import numpy as np
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator.verification import revealed_sample_seed, verifier_sample

from psyche_client.round.checks import (
    Score,
    Thresholds,
    VerifierChecks,
    agreement_milli,
    failure,
)
from psyche_client.round.context import RoundContext
from psyche_client.round.ports import DataFetcher, Uplink
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.training.backend import DecodedResult, ResultVerifier
from psyche_client.verify.threshold import ACCUSE_BELOW

log = logging.getLogger("psyche.client")


class _Unknown:
    """The point a trainer trained at cannot be recomputed here (`_lookahead_of`)."""


UNKNOWN = _Unknown()

LOOKAHEAD_WAIT = 30.0
"""Seconds a verifier waits for a trainer's result of the step before (the direction of its
lookahead) before leaving that trainer's batch unchecked."""

EARLIER_WAIT = 5.0
"""Seconds a verified result waits for the results announced before it to settle before it
is scored without those still downloading (see the module docstring)."""


class RoundVerifier:
    def __init__(
        self,
        ctx: RoundContext,
        uplink: Uplink,
        fetch_samples: DataFetcher | None,
        threshold: float = ACCUSE_BELOW,
        earlier_wait: float = EARLIER_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.uplink = uplink
        self.fetch_samples = fetch_samples
        self.thresholds = Thresholds(agreement=threshold)
        self.earlier_wait = earlier_wait
        self._clock = clock
        self._ready_since: dict[bytes, float] = {}
        """Commitment → when its verified result was first seen waiting for earlier ones."""

    async def recompute(self, round_: RoundState) -> None:
        """Build `round_.checks` (call once its weights are applied, before it trains)."""
        backend = self.ctx.backend
        checker = None if backend is None else backend.capabilities.verifier
        if backend is None or checker is None or self.fetch_samples is None:
            log.info(
                "verifier of step %d: this backend cannot check results",
                round_.step,
                extra=self.ctx.fields(),
            )
            return
        async with self.ctx.model_lock:
            expected = backend.weights_hash()
        checks = VerifierChecks(expected)
        for batch in round_.roles.batch_ids:  # the sample is not known yet: every batch
            trainer = round_.roles.assignments.get(batch)
            along = await self._lookahead_of(trainer, round_.step)
            if along is UNKNOWN:
                log.info(
                    "verifier: %s of step %d not checked: the lookahead result of its trainer "
                    "%s (step %d) is not here",
                    batch,
                    round_.step,
                    short_id(trainer) if trainer else "?",
                    round_.step - 1,
                    extra=self.ctx.fields(),
                )
                continue
            try:
                samples = await self.fetch_samples(batch)
            except Exception as exc:  # the fetcher retried already
                log.warning("verifier: no data for %s: %s", batch, exc, extra=self.ctx.fields())
                continue
            async with self.ctx.model_lock:
                if round_.cancelled or self.ctx.out_of_sync is not None:
                    return
                if backend.weights_hash() != expected:
                    log.warning(
                        "verifier of step %d: the weights changed after %d of %d batches; "
                        "the others are not checked",
                        round_.step,
                        len(checks.references),
                        len(round_.roles.batch_ids),
                        extra=self.ctx.fields(),
                    )
                    break
                reference = await asyncio.to_thread(
                    checker.recompute,
                    np.asarray(samples, dtype=np.int64),
                    round_.step,
                    None if isinstance(along, _Unknown) else along,
                )
            if reference is None:
                log.info("verifier: this run's optimizer has no check", extra=self.ctx.fields())
                return
            checks.references[batch] = reference
        if not checks.references:
            return
        round_.checks = checks
        log.info(
            "verifier recomputed",
            extra=self.ctx.fields(
                verified_step=round_.step, batches=[str(b) for b in checks.references]
            ),
        )
        self.check_rounds()

    async def _lookahead_of(
        self, trainer: bytes | None, step: int
    ) -> DecodedResult | _Unknown | None:
        """The published result of step − 1 that `trainer` looked ahead along when it trained
        `step` (`distro.lookahead`): its last batch's verified result of the previous round,
        awaited up to `LOOKAHEAD_WAIT` seconds; None when it trained no batch of step − 1 (or
        announced no result for it: nothing of its own was in flight), `UNKNOWN` when it did
        but the result cannot be had here (or it announced two for one batch)."""
        # the round before: the previous one, or the current one while this round is being
        # prepared early (during the current round's RoundWitness)
        previous = next(
            (
                r
                for r in (self.ctx.current, self.ctx.previous)
                if r is not None and r.step == step - 1
            ),
            None,
        )
        if trainer is None or previous is None:
            return None
        mine = sorted(b for b, owner in previous.roles.assignments.items() if owner == trainer)
        if not mine:
            return None
        last = mine[-1]
        downloads = [
            d
            for d in previous.downloads.values()
            if d.batch == last and d.announcement.sender_id == trainer
        ]
        if not downloads:
            return None
        if len(downloads) > 1:
            return UNKNOWN
        download = downloads[0]
        task = download.task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), LOOKAHEAD_WAIT)
        if download.status != DownloadStatus.VERIFIED or download.result is None:
            return UNKNOWN
        return download.result

    def check_rounds(self) -> None:
        """Take a newly revealed sample, score the verified results that are due since the
        last call (never blocks; the runner calls it on every change and every tick, so a
        capped wait runs out)."""
        if self.ctx.out_of_sync is not None:
            return
        now = self._clock()
        live: set[bytes] = set()
        for round_ in (self.ctx.current, self.ctx.previous):
            checks = None if round_ is None else round_.checks
            if round_ is None or checks is None or round_.cancelled:
                continue
            if checks.sample is None and not self._reveal(round_, checks):
                continue
            earlier_settled = True
            for data_hash, download in list(round_.downloads.items()):
                verified = (
                    download.status == DownloadStatus.VERIFIED and download.result is not None
                )
                # a result is scored once every result announced before it has settled (the
                # copy check compares it with all of them), or once it waited `earlier_wait`
                if verified and checks.wants(download.batch, data_hash):
                    since = self._ready_since.setdefault(data_hash, now)
                    if earlier_settled or now - since >= self.earlier_wait:
                        checks.scored.add(data_hash)
                        earlier = earlier_results(round_, data_hash)
                        self.ctx.tasks.spawn(
                            self._score(round_, checks, data_hash, download, earlier)
                        )
                    else:
                        live.add(data_hash)
                earlier_settled = earlier_settled and download.settled
        self._ready_since = {h: t for h, t in self._ready_since.items() if h in live}

    def _reveal(self, round_: RoundState, checks: VerifierChecks) -> bool:
        """Whether `round_`'s sample is known, taking it from the coordinator if revealed."""
        coordinator = self.ctx.coordinator
        seed = None if coordinator is None else revealed_sample_seed(coordinator, round_.step)
        if seed is None:
            return False
        checks.reveal(
            verifier_sample(seed, self.ctx.me, round_.roles.batch_ids, round_.roles.verifiers)
        )
        log.info(
            "verifier sample revealed",
            extra=self.ctx.fields(
                verified_step=round_.step, batches=[str(b) for b in checks.sample or ()]
            ),
        )
        return True

    async def _score(
        self,
        round_: RoundState,
        checks: VerifierChecks,
        data_hash: bytes,
        download: ResultDownload,
        earlier: list[tuple[bytes, DecodedResult]],
    ) -> None:
        backend = self.ctx.backend
        checker = None if backend is None else backend.capabilities.verifier
        if checker is None or download.result is None:
            return
        trainer = download.announcement.sender_id
        try:
            score = await asyncio.to_thread(
                score_result, checker, checks, download.batch, download.result, earlier
            )
        except ValueError as exc:
            log.warning("verifier: cannot score %s: %s", download.batch, exc)
            return
        agreement = score.agreement
        checks.agreements[data_hash] = agreement
        failed = failure(score, self.thresholds)
        log.info(
            "verifier scored",
            extra=self.ctx.fields(
                verified_step=round_.step,
                batch=str(download.batch),
                trainer=short_id(trainer),
                agreement=round(agreement, 4),
                margin=None if score.margin is None else round(score.margin, 4),
                overlap=round(score.overlap, 4),
                copied_from=None if score.copied_from is None else score.copied_from.hex(),
                failed=failed,
            ),
        )
        verdict = checks.report(download.batch, score, self.thresholds)
        if verdict is False:
            await self.uplink.send_attestation(
                round_.step, trainer, download.batch, agreement_milli(agreement), data_hash
            )
        elif verdict:
            log.warning(
                "verifier: the result of %s for %s at step %d fails the %s check (agreement "
                "%.3f, margin %s, overlap %.3f): reporting it",
                short_id(trainer),
                download.batch,
                round_.step,
                failed,
                agreement,
                "-" if score.margin is None else f"{score.margin:.3f}",
                score.overlap,
                extra=self.ctx.fields(),
            )
            await self.uplink.send_accusation(
                round_.step, trainer, download.batch, agreement_milli(agreement), data_hash
            )


def earlier_results(round_: RoundState, data_hash: bytes) -> list[tuple[bytes, DecodedResult]]:
    """The verified results of other trainers announced in `round_` before `data_hash`'s, as
    (commitment, result), in the order their announcements arrived."""
    mine = round_.downloads[data_hash].announcement.sender_id
    out: list[tuple[bytes, DecodedResult]] = []
    for other_hash, other in round_.downloads.items():
        if other_hash == data_hash:
            break
        if (
            other.status == DownloadStatus.VERIFIED
            and other.result is not None
            and other.announcement.sender_id != mine
        ):
            out.append((other_hash, other.result))
    return out


def score_result(
    verifier: ResultVerifier,
    checks: VerifierChecks,
    batch: BatchId,
    result: DecodedResult,
    earlier: list[tuple[bytes, DecodedResult]],
) -> Score:
    """Every check of one result (runs in a worker thread): its agreement with its batch's
    reference, the margin over the other batch of the sample, and the earlier result of
    another trainer it overlaps most."""
    agreement = verifier.agreement(checks.references[batch], result)
    others = [b for b in checks.references if b != batch]
    margin = None
    if others:
        margin = agreement - verifier.agreement(checks.references[others[0]], result)
    overlap = 0.0
    copied_from = None
    for other_hash, other in earlier:
        value = verifier.overlap(result, other)
        if value > overlap:
            overlap, copied_from = value, other_hash
    return Score(agreement, margin, overlap, copied_from)

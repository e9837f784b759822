"""The verifier stage: recompute a sample of the round's batches, score the trainers' results.

A client whose committee is `Verifier` in round h trains nothing. Once the apply before round
h is done (the weights every trainer of round h starts from), it fetches the samples of its
batches (`verifier_sample`: chosen from the round's seed and its own id) and, under the model
lock, recomputes each batch's reference (`VerifyingBackend.recompute`: the DCT of the plain
gradient; weights unchanged). Every verified result announced for those batches is then scored
(`VerifyingBackend.agreement`) as it arrives and reported to the coordinator, once per batch:
a score below the threshold as an accusation (`Uplink.send_accusation`), any other as an
attestation (`Uplink.send_attestation`), both naming the commitment scored. The coordinator
convicts when independent verifiers agree and removes accusers that others refute.

Nothing here changes what the client applies: the coordinator's record of convictions does,
the same way for every client (`ApplyStep`). If the weights moved before the recompute (the
next round's early apply ran first), the check is skipped rather than made on wrong weights.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
from psyche_common.client_id import short_id
from psyche_common.coordinator.verification import verifier_sample

from psyche_client.round.checks import VerifierChecks, agreement_milli
from psyche_client.round.context import RoundContext
from psyche_client.round.ports import DataFetcher, Uplink
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.training.backend import VerifyingBackend
from psyche_client.verify.threshold import ACCUSE_BELOW

log = logging.getLogger("psyche.client")


class RoundVerifier:
    def __init__(
        self,
        ctx: RoundContext,
        uplink: Uplink,
        fetch_samples: DataFetcher | None,
        threshold: float = ACCUSE_BELOW,
    ) -> None:
        self.ctx = ctx
        self.uplink = uplink
        self.fetch_samples = fetch_samples
        self.threshold = threshold

    async def recompute(self, round_: RoundState) -> None:
        """Build `round_.checks` (call once its weights are applied, before it trains)."""
        backend = self.ctx.backend
        if not isinstance(backend, VerifyingBackend) or self.fetch_samples is None:
            log.info(
                "verifier of step %d: this backend cannot check results",
                round_.step,
                extra=self.ctx.fields(),
            )
            return
        async with self.ctx.model_lock:
            expected = backend.weights_hash()
        sample = verifier_sample(round_.roles.random_seed, self.ctx.me, round_.roles.batch_ids)
        checks = VerifierChecks(expected)
        for batch in sample:
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
                        "verifier of step %d: the weights changed before the check; skipped",
                        round_.step,
                        extra=self.ctx.fields(),
                    )
                    return
                reference = await asyncio.to_thread(
                    backend.recompute, np.asarray(samples, dtype=np.int64)
                )
            if reference is None:
                log.info("verifier: this run's optimizer has no check", extra=self.ctx.fields())
                return
            checks.references[batch] = reference
        round_.checks = checks
        log.info(
            "verifier recomputed",
            extra=self.ctx.fields(
                verified_step=round_.step, batches=[str(b) for b in checks.references]
            ),
        )
        self.check_rounds()

    def check_rounds(self) -> None:
        """Score the verified results that arrived since the last call (never blocks)."""
        if self.ctx.out_of_sync is not None:
            return
        for round_ in (self.ctx.current, self.ctx.previous):
            checks = None if round_ is None else round_.checks
            if round_ is None or checks is None or round_.cancelled:
                continue
            for data_hash, download in list(round_.downloads.items()):
                if download.status != DownloadStatus.VERIFIED or download.result is None:
                    continue
                if checks.wants(download.batch, data_hash):
                    checks.scored.add(data_hash)
                    self.ctx.tasks.spawn(self._score(round_, checks, data_hash, download))

    async def _score(
        self, round_: RoundState, checks: VerifierChecks, data_hash: bytes, download: ResultDownload
    ) -> None:
        backend = self.ctx.backend
        if not isinstance(backend, VerifyingBackend) or download.result is None:
            return
        trainer = download.announcement.sender_id
        try:
            agreement = await asyncio.to_thread(
                backend.agreement, checks.references[download.batch], download.result
            )
        except ValueError as exc:
            log.warning("verifier: cannot score %s: %s", download.batch, exc)
            return
        checks.agreements[data_hash] = agreement
        log.info(
            "verifier scored",
            extra=self.ctx.fields(
                verified_step=round_.step,
                batch=str(download.batch),
                trainer=short_id(trainer),
                agreement=round(agreement, 4),
            ),
        )
        verdict = checks.verdict(download.batch, agreement, self.threshold)
        if verdict is False:
            await self.uplink.send_attestation(
                round_.step, trainer, download.batch, agreement_milli(agreement), data_hash
            )
        elif verdict:
            log.warning(
                "verifier: the result of %s for %s at step %d agrees %.3f with the recomputed "
                "gradient (threshold %.2f): reporting it",
                short_id(trainer),
                download.batch,
                round_.step,
                agreement,
                self.threshold,
                extra=self.ctx.fields(),
            )
            await self.uplink.send_accusation(
                round_.step, trainer, download.batch, agreement_milli(agreement), data_hash
            )

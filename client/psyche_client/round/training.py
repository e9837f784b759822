"""Training a round's batches (reference §2.5): fetch each batch's samples, train it in a
worker thread under the model lock, and publish the result — or hold it while the round is
only predicted (`RoundStage.PREDICTED`) and publish it once the round is confirmed.
A round's verifier (no batches) recomputes its sample here instead (`RoundVerifier`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np
from psyche_common.batch_id import BatchId
from psyche_common.data import DataError, DataIndexError

from psyche_client.round.context import RoundContext
from psyche_client.round.exchange import ResultExchange
from psyche_client.round.phase import Phase
from psyche_client.round.ports import DataFetcher, RunnerOptions
from psyche_client.round.state import RoundState
from psyche_client.round.tasks import EndOfRun
from psyche_client.round.verifier import RoundVerifier

log = logging.getLogger("psyche.client")


class RoundTraining:
    def __init__(
        self,
        ctx: RoundContext,
        exchange: ResultExchange,
        fetch_samples: DataFetcher | None,
        options: RunnerOptions,
        on_change: Callable[[], None],
        verifier: RoundVerifier | None = None,
    ) -> None:
        self.ctx = ctx
        self.verifier = verifier
        self.exchange = exchange
        self.fetch_samples = fetch_samples
        self.options = options
        self.on_change = on_change

    async def train(self, round_: RoundState, after: Awaitable[object] | None) -> None:
        """Train `round_`'s batches once `after` (the apply before it) is done."""
        backend = self.ctx.require_backend()
        if after is not None:
            await asyncio.shield(after)  # shared with the report and health-check tasks
        if (
            self.verifier is not None
            and round_.have_training
            and round_.roles.is_verifier
            and self.options.needs_data
        ):
            await self.verifier.recompute(round_)  # on the weights this round's trainers use
        if round_.have_training:
            for batch in round_.roles.my_batches:
                if round_.cancelled or self.ctx.out_of_sync is not None:
                    break
                samples = await self._fetch(batch) if self.options.needs_data else None
                if self.options.needs_data and samples is None:
                    continue
                async with self.ctx.model_lock:
                    if round_.cancelled:
                        break
                    output = await asyncio.to_thread(
                        backend.train, round_.step, batch, samples, lambda: round_.cancelled
                    )
                    if output is None or round_.cancelled:
                        if output is not None:
                            await asyncio.to_thread(backend.cancel_round)
                        log.info("training of step %d stopped: result dropped", round_.step)
                        break
                round_.losses.append(output.loss)
                round_.tokens_trained += output.tokens
                round_.samples_trained += len(batch)
                round_.batches_done += 1
                if round_.confirmed:
                    await self.exchange.publish(round_, batch, output)
                else:
                    round_.held_results.append((batch, output))
        round_.end_training(time.monotonic())
        self.on_change()
        log.info(
            "trained step" if round_.losses else "round without training",
            extra=self.ctx.fields(
                step=round_.step,
                loss=round_.mean_loss(),
                weights_hash=backend.weights_hash().hex(),
                batches=len(round_.losses),
                samples=round_.samples_trained,
            ),
        )

    def end_training_time(self) -> None:
        """The current round's training time is over (if we were training in it)."""
        round_ = self.ctx.current
        if self.ctx.phase != Phase.TRAINING or round_ is None:
            return
        round_.stop()
        self.ctx.stats.round_finished(round_)

    async def publish_held(self, round_: RoundState) -> None:
        """The predicted round was confirmed (`RoundState.confirm`): publish what it held
        (what it trains from now on is published as it is trained)."""
        if not round_.confirmed:
            raise RuntimeError(f"step {round_.step}: held results of an unconfirmed round")
        held, round_.held_results = round_.held_results, []
        for batch, output in held:
            await self.exchange.publish(round_, batch, output)

    async def discard(self, round_: RoundState) -> None:
        """The predicted round did not start as predicted: stop and forget its results."""
        round_.cancel()
        if round_.held_results:
            round_.held_results = []
            async with self.ctx.model_lock:
                await asyncio.to_thread(self.ctx.require_backend().cancel_round)

    async def _fetch(self, batch: BatchId) -> np.ndarray | None:
        """The batch's samples, or None (logged) when they could not be fetched; raises
        `EndOfRun` when the batch lies past the end of the data: every later batch would too,
        so the client leaves instead of idling through empty rounds."""
        assert self.fetch_samples is not None
        try:
            return await self.fetch_samples(batch)
        except DataIndexError as exc:
            raise EndOfRun(
                f"the training data is exhausted: {batch} lies past its end ({exc}); leaving "
                "the run (it needs more data, or a smaller config.total_steps)"
            ) from exc
        except DataError as exc:  # the fetcher retried already; anything else is a bug
            log.error(
                "giving up on %s: %s; it will not be trained", batch, exc, extra=self.ctx.fields()
            )
            return None

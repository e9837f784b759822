"""A client whose batch lies past the end of its data leaves the run cleanly: one message,
no traceback, exit status 0 (instead of `giving up on B[..]` and an empty round, forever)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from psyche_client.app.outcome import exit_code
from psyche_client.round.context import RoundContext
from psyche_client.round.ports import RunnerOptions
from psyche_client.round.roles import RoundRoles
from psyche_client.round.state import RoundState
from psyche_client.round.stats import ClientStats
from psyche_client.round.tasks import EndOfRun
from psyche_client.round.training import RoundTraining
from psyche_client.training.backend import DummyBackend
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.data import DataFetchError, DataIndexError
from psyche_common.protocol import Identity

BATCH = BatchId(16, 19)


def training_fetching(failure: Exception) -> tuple[RoundTraining, RoundContext, RoundState]:
    """The training stage of a round in which this client trains `BATCH`, whose fetch fails
    with `failure`."""
    ctx = RoundContext(Identity.generate(), ClientStats())
    ctx.backend = DummyBackend(0.0)

    async def fetch(_batch: BatchId) -> np.ndarray:
        raise failure

    roles = RoundRoles(
        step=5,
        height=4,
        my_index=0,
        committee_proof=None,
        witness_proof=None,
        selection=None,
        assignments={BATCH: ctx.identity.public_key},
        batch_ids=(BATCH,),
        my_batches=(BATCH,),
    )
    round_ = RoundState.start(roles, 1, True, 0.0, bloom_factory=lambda n: Bloom.random())
    options = RunnerOptions(download_backoff=0.0, needs_data=True)
    training = RoundTraining(ctx, None, fetch, options, lambda: None)  # type: ignore[arg-type]
    return training, ctx, round_


async def test_data_past_its_end_ends_the_client_with_status_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    training, ctx, round_ = training_fetching(
        DataIndexError("index 16 is out of bounds: the data has 16 sequences")
    )
    caplog.set_level(logging.INFO)
    ctx.tasks.spawn(training.train(round_, None))
    fatal = await asyncio.wait_for(ctx.tasks.wait_fatal(), 10)
    assert isinstance(fatal, EndOfRun)
    assert "the training data is exhausted: B[16, 19]" in str(fatal)
    assert "16 sequences" in str(fatal)
    ends = [r for r in caplog.records if "training data is exhausted" in r.getMessage()]
    assert ends and all(r.exc_info is None for r in ends)  # a message, not a failure
    assert not [r for r in caplog.records if "giving up on" in r.getMessage()]

    async def fatal_task() -> BaseException:
        return fatal

    task = asyncio.create_task(fatal_task(), name="fatal")
    await task
    assert exit_code(task) == 0


async def test_a_fetch_that_fails_otherwise_only_skips_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    training, ctx, round_ = training_fetching(DataFetchError("server down", retryable=False))
    caplog.set_level(logging.INFO)
    await training.train(round_, None)
    assert ctx.tasks.fatal is None and round_.batches_done == 0
    assert [r for r in caplog.records if "giving up on B[16, 19]" in r.getMessage()]

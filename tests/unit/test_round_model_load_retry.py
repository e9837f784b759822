"""A model load that finds no model now (`ModelUnavailable`: no peer answered, or the peers
disagree) is retried with the latest coordinator state instead of ending the client."""

from __future__ import annotations

import asyncio
import logging

import pytest
from psyche_client.round.ports import ModelUnavailable, RunnerOptions
from psyche_client.round.runner import RoundRunner
from psyche_client.training.backend import DummyBackend
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in
from tests.support.fakes import RecordingUplink, lone_network


def runner_with(load: object) -> RoundRunner:
    identity = Identity.generate()
    return RoundRunner(
        identity,
        lone_network(identity.public_key),
        RecordingUplink(identity.public_key),
        load,  # type: ignore[arg-type]
        None,
        RunnerOptions(needs_data=False, load_retry_first=0.05, load_retry_max=0.1),
    )


async def test_an_unavailable_model_is_loaded_again_with_the_latest_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[int] = []

    async def load(coordinator: Coordinator) -> DummyBackend:
        seen.append(coordinator.progress.step)
        if len(seen) < 3:
            raise ModelUnavailable("no manifest has a majority: 2 peers answered ([1, 1])")
        return DummyBackend(0.0)

    runner = runner_with(load)
    first = coordinator_in(RunState.Warmup, [runner.ctx.me, b"p" * 32], step=5)
    caplog.set_level(logging.WARNING, logger="psyche.client")
    await runner.on_state(first)
    runner.ctx.coordinator = coordinator_in(RunState.Warmup, [runner.ctx.me, b"p" * 32], step=6)
    async with asyncio.timeout(5):
        while runner.backend is None:
            await asyncio.sleep(0.01)
    assert runner.fatal is None
    assert seen == [5, 6, 6]  # the retries read the latest state
    warnings = [
        r.getMessage() for r in caplog.records if "could not load the model" in r.getMessage()
    ]
    assert len(warnings) == 2 and "no manifest has a majority" in warnings[0]
    await runner.aclose()


async def test_any_other_load_error_still_ends_the_client() -> None:
    async def load(_coordinator: Coordinator) -> DummyBackend:
        raise RuntimeError("the checkpoint directory is not readable")

    runner = runner_with(load)
    await runner.on_state(coordinator_in(RunState.Warmup, [runner.ctx.me], step=5))
    async with asyncio.timeout(5):
        error = await runner.wait_fatal()
    assert "not readable" in str(error)
    await runner.aclose()

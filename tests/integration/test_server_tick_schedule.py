"""The server ticks at the moment a state's timeout can first fire, not only on its grid."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from psyche_common.coordinator.types import RunState
from psyche_server.app import state_timeout_deadline

from tests.support.server_harness import load_coordinator, running_server, write_state


def test_deadline_is_start_plus_duration_never_the_start_itself(tmp_path: Path) -> None:
    coordinator = load_coordinator(
        write_state(tmp_path / "s.toml", round_witness_time=0, max_round_train_time=3)
    )
    coordinator.run_state_start_ms = 1_000_250
    coordinator.run_state = RunState.RoundWitness
    assert state_timeout_deadline(coordinator) == 1000.251  # duration 0: the next millisecond
    coordinator.run_state = RunState.RoundTrain
    assert state_timeout_deadline(coordinator) == 1003.25
    coordinator.run_state = RunState.Finished
    assert state_timeout_deadline(coordinator) is None


def test_deadline_of_a_fractional_round_witness_time(tmp_path: Path) -> None:
    coordinator = load_coordinator(write_state(tmp_path / "s.toml", round_witness_time=0.2))
    coordinator.run_state_start_ms = 1_000_250
    coordinator.run_state = RunState.RoundWitness
    assert state_timeout_deadline(coordinator) == 1000.45
    assert coordinator.check_timeout(1000.45, coordinator.config.round_witness_time)
    assert not coordinator.check_timeout(1000.449, coordinator.config.round_witness_time)


async def test_state_timeout_fires_between_grid_ticks(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=1)
    # a 30 s grid: after the first tick only the timeout-scheduled ticks can move the state
    async with running_server(state, tick_interval=30.0) as app:
        app.roster.join(b"a" * 32, "127.0.0.1:1")
        app.roster.join(b"b" * 32, "127.0.0.1:2")
        app.tick()  # WaitingForMembers has timed out long ago: enter Warmup now
        assert app.run_state == RunState.Warmup
        warmup_began = app.coordinator.run_state_start_ms / 1000
        # the pending ids never witness: Warmup ends by its timeout, one second later
        # (the server wakes for it even though the next grid tick is 30 s away)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2.5
        while app.run_state == RunState.Warmup and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert app.run_state == RunState.RoundTrain
        began = app.coordinator.run_state_start_ms / 1000
        assert warmup_began + 1 <= began < warmup_began + 1.1
        assert time.time() - (warmup_began + 1) < 0.3

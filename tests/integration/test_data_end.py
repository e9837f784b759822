"""A run whose served data runs out ends cleanly (in-process server and data server, protocol
clients): `config.total_steps` is lowered before a round would read past the data, the epoch
cools down and the run is Finished, instead of rounds that train nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.data.local import LocalDataProvider
from psyche_server.data_end import data_end_step
from psyche_server.data_server import DataServer

from bench.harness.protocol_client import start_clients
from tests.support.server_harness import (
    load_coordinator,
    poll_until,
    running_server,
    write_state,
)

pytestmark = pytest.mark.timeout(60)
SEQ_LEN = 8


def token_dir(tmp_path: Path, sequences: int) -> Path:
    directory = tmp_path / "tokens"
    directory.mkdir()
    np.arange(sequences * SEQ_LEN, dtype="<u2").tofile(directory / "part0.bin")
    return directory


def in_round(coordinator: Coordinator, step: int, data_index: int) -> Coordinator:
    coordinator.run_state = RunState.RoundTrain
    coordinator.progress.step = step
    coordinator.current_round().data_index = data_index
    return coordinator


def test_the_rule_stops_before_the_first_round_that_does_not_fit(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", global_batch_size=4, total_steps=100)
    # 10 samples: rounds read [0, 3], [4, 7]; [8, 11] would not fit
    assert data_end_step(in_round(load_coordinator(state), 1, 0), 10) is None
    end = data_end_step(in_round(load_coordinator(state), 2, 4), 10)
    assert end is not None and (end.step, end.start, end.end, end.held) == (3, 8, 11, 10)
    # exactly enough: [8, 11] fits 12 samples
    assert data_end_step(in_round(load_coordinator(state), 2, 4), 12) is None
    # a run that ends by itself first is left alone
    short = write_state(tmp_path / "short.toml", global_batch_size=4, total_steps=3)
    assert data_end_step(in_round(load_coordinator(short), 2, 4), 10) is None
    # before an epoch: its first round starts at the epoch's cursor
    waiting = load_coordinator(state)
    waiting.progress.epoch_start_data_index = 8
    end = data_end_step(waiting, 10)
    assert end is not None and (end.step, end.start) == (1, 8)


async def test_the_run_finishes_when_the_served_data_runs_out(tmp_path: Path) -> None:
    # 12 samples, 4 per round: steps 1-3 train, step 4 would read [12, 15]
    local = LocalDataProvider(token_dir(tmp_path, 12), "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id="data-end")
    state = write_state(
        tmp_path / "s.toml",
        run_id="data-end",
        global_batch_size=4,
        max_seq_len=SEQ_LEN,
        total_steps=1000,
        warmup_time=1,
        data_location={"Server": "127.0.0.1:1"},
    )
    async with running_server(state, data_server=data_server) as app:
        clients = await start_clients(2, app.port, app.run_id, train_delay=0.05)
        await poll_until(lambda: app.run_state == RunState.Finished, timeout=45)
        assert app.coordinator.progress.step == 4
        assert app.coordinator.config.total_steps == 4
        assert app.data_end is not None and app.data_end.ended_at is not None
        assert clients[0].coordinator is not None
        await poll_until(lambda: clients[0].coordinator.run_state == RunState.Finished)
        for client in clients:
            await client.close()


async def test_data_too_short_for_one_round_finishes_a_waiting_run(tmp_path: Path) -> None:
    local = LocalDataProvider(token_dir(tmp_path, 3), "TwoBytes", SEQ_LEN)
    data_server = DataServer(local, "127.0.0.1", 0, run_id="too-short")
    state = write_state(
        tmp_path / "s.toml",
        run_id="too-short",
        global_batch_size=4,
        max_seq_len=SEQ_LEN,
        data_location={"Server": "127.0.0.1:1"},
    )
    async with running_server(state, data_server=data_server) as app:
        assert app.run_state == RunState.Finished
        assert app.coordinator.config.total_steps == 1

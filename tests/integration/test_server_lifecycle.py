"""Lifecycle scenarios the reference does not test: ejection of a client that stops training,
pause/resume from the dashboard action, and weights-hash divergence flagging."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

from psyche_common.coordinator import RunState
from psyche_common.coordinator.types import ClientState

from bench.harness.protocol_client import ProtocolClient, start_clients
from tests.support.server_harness import poll_until, running_server, write_state


async def test_client_that_stops_training_is_ejected(tmp_path: Path) -> None:
    # witness_nodes = 0: every client witnesses; the lazy one never does, and the honest
    # witnesses leave it out of their participant blooms, so from height 2 on they accuse it.
    state = write_state(
        tmp_path / "s.toml",
        init_min_clients=3,
        min_clients=2,
        global_batch_size=3,
        witness_nodes=0,
        max_round_train_time=1,
        epoch_time=60,
    )
    async with running_server(state) as app:
        lazy = await ProtocolClient(
            app.port, app.run_id, witness=False, health_checks=False
        ).connect()
        honest = await start_clients(2, app.port, app.run_id, exclude_from_bloom=[lazy.id])
        await poll_until(
            lambda: any(
                c.id == lazy.id and c.state == ClientState.Dropped
                for c in app.coordinator.epoch_state.exited_clients
            ),
            timeout=30,
        )
        await poll_until(lambda: lazy.id not in app.pending)
        assert len(app.pending) == 2
        assert {c.id for c in app.coordinator.epoch_state.clients} == {c.id for c in honest}
        assert app.run_state in (RunState.RoundTrain, RunState.RoundWitness)
        # the ejected client stays connected and keeps receiving states
        seen = lazy.states_received
        await poll_until(lambda: lazy.states_received > seen)
        await asyncio.gather(*(c.close() for c in [lazy, *honest]))


async def test_pause_is_deferred_to_cooldown_and_resume_restarts(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, global_batch_size=2)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id)
        await poll_until(lambda: app.run_state == RunState.RoundTrain)
        assert app.toggle_pause() == "pause pending"
        assert app.pause_pending
        await poll_until(lambda: app.run_state == RunState.Cooldown, timeout=15)
        await poll_until(lambda: app.run_state == RunState.Paused, timeout=10)
        assert not app.pause_pending
        assert app.coordinator.epoch_state.cold_start_epoch
        epoch = app.coordinator.progress.epoch
        assert app.toggle_pause() == "resumed"
        # the connected clients are still pending and start the next epoch
        await poll_until(lambda: app.run_state == RunState.Warmup, timeout=10)
        assert len(app.coordinator.epoch_state.clients) == 2
        assert app.coordinator.progress.epoch == epoch
        for c in clients:
            assert c.coordinator is not None
        await asyncio.gather(*(c.close() for c in clients))


async def test_pause_while_waiting_is_immediate(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2)
    async with running_server(state) as app:
        assert app.toggle_pause() == "paused"
        assert app.run_state == RunState.Paused
        client = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await client.wait_for(lambda c: c.run_state == RunState.Paused, timeout=5)
        assert app.toggle_pause() == "resumed"
        await client.wait_for(lambda c: c.run_state == RunState.WaitingForMembers, timeout=5)
        await client.close()


async def test_divergent_weights_are_flagged(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)
    state = write_state(
        tmp_path / "s.toml", init_min_clients=3, global_batch_size=3, witness_nodes=0
    )
    async with running_server(state) as app:
        odd = await ProtocolClient(
            app.port, app.run_id, weights_hash=lambda step: hashlib.sha256(b"odd%d" % step).digest()
        ).connect()
        others = await start_clients(2, app.port, app.run_id)
        await poll_until(lambda: odd.id in app.weights.divergent_clients(), timeout=20)
        assert not (app.weights.divergent_clients() & {c.id for c in others})
        records = [r for r in caplog.records if getattr(r, "event", None) == "weights_divergence"]
        assert records and records[0].client == odd.short_id
        # the outlier is told, with the majority's hash, so that it resyncs; the others are not
        await poll_until(lambda: bool(odd.mismatches), timeout=10)
        notice = odd.mismatches[0]
        assert notice.majority_hash == others[0].weights_hash(notice.step)
        assert not any(c.mismatches for c in others)
        await asyncio.gather(*(c.close() for c in [odd, *others]))


async def test_init_warmup_time_applies_until_the_run_is_active(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=60)
    async with running_server(state, init_warmup_time=1) as app:
        assert app.coordinator.config.warmup_time == 1
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.RoundTrain, timeout=10)
        assert app.coordinator.config.warmup_time == 60  # restored once active
        await asyncio.gather(*(c.close() for c in clients))


async def test_no_withdraw_on_disconnect(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=30)
    async with running_server(state, withdraw_on_disconnect=False) as app:
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        clients[1].abort()
        await poll_until(lambda: len(app.pending) == 1)
        await asyncio.sleep(0.5)
        assert app.run_state == RunState.Warmup
        assert all(c.state == ClientState.Healthy for c in app.coordinator.epoch_state.clients)
        assert len(app.coordinator.epoch_state.clients) == 2
        await clients[0].close()

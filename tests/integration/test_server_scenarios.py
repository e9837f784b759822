"""The reference's 13 centralized integration scenarios (psyche-testnet_tui_data.md §2.2),
ported with model-free protocol clients and short phases (warmup 2 s, witness 1 s, ...).

Each test states the reference's parameters as (init_min_clients, global_batch_size,
witness_nodes); the clients' `train_delay` plays the reference's training delay.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from psyche_common.coordinator import RunState
from psyche_common.coordinator.types import ClientState

from bench.harness.protocol_client import ProtocolClient, start_clients
from tests.support.server_harness import poll_until, running_server, write_state


def healthy_score(app, slot: int) -> int:
    coordinator = app.coordinator
    witnesses = coordinator.epoch_state.rounds[slot].witnesses
    return sum(
        coordinator.trainer_health_score(c.id, witnesses) for c in coordinator.epoch_state.clients
    )


async def close_all(clients: list[ProtocolClient]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


async def test_01_connect_single_node(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, global_batch_size=4)
    async with running_server(state) as app:
        clients = await start_clients(1, app.port, app.run_id)
        await poll_until(lambda: len(app.pending) == 1)
        await asyncio.sleep(0.3)
        assert app.run_state == RunState.WaitingForMembers
        assert len(app.coordinator.epoch_state.clients) == 0
        await close_all(clients)


async def test_02_connect_multiple_nodes(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=15, global_batch_size=4)
    async with running_server(state) as app:
        clients = await start_clients(10, app.port, app.run_id)
        await poll_until(lambda: len(app.pending) == 10)
        await asyncio.sleep(0.3)
        assert app.run_state == RunState.WaitingForMembers
        await close_all(clients)


async def test_03_waiting_for_members_to_warmup(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=30)
    async with running_server(state) as app:
        assert len(app.coordinator.epoch_state.clients) == 0
        assert app.run_state == RunState.WaitingForMembers
        # passive clients: no warmup witness, so the run stays in the 30 s warmup
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        assert len(app.coordinator.epoch_state.clients) == 2
        await close_all(clients)


async def test_04_shutdown_node_in_warmup(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=30)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        clients[1].abort()
        await poll_until(lambda: app.run_state == RunState.WaitingForMembers)
        assert len(app.coordinator.epoch_state.clients) == 1
        assert len(app.pending) == 1
        await close_all(clients)


async def test_05_waiting_for_members_to_round_train(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, warmup_time=2)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        assert len(app.coordinator.epoch_state.clients) == 2
        # without warmup witnesses the warmup ends by its 2 s timeout
        await poll_until(lambda: app.run_state == RunState.RoundTrain, timeout=5)
        await close_all(clients)


async def test_06_waiting_for_members_to_round_witness(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, max_round_train_time=2)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.RoundTrain, timeout=6)
        assert len(app.coordinator.epoch_state.clients) == 2
        # nobody witnesses: the round ends by the max_round_train_time timeout
        await poll_until(lambda: app.run_state == RunState.RoundWitness, timeout=5)
        await close_all(clients)


async def test_07_all_clients_participate_in_witness_bloom(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=5, global_batch_size=5)
    async with running_server(state) as app:
        assert app.coordinator.epoch_state.rounds_head == 0
        assert not app.coordinator.epoch_state.rounds[0].witnesses
        clients = await start_clients(5, app.port, app.run_id, train_delay=0.5)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        await poll_until(lambda: app.run_state == RunState.RoundTrain)
        await poll_until(lambda: app.run_state == RunState.RoundWitness)
        await poll_until(lambda: app.coordinator.epoch_state.rounds_head == 1)
        await poll_until(lambda: app.coordinator.epoch_state.rounds_head == 2)
        assert healthy_score(app, 1) == 5
        await close_all(clients)


async def test_08_replace_node_and_complete_round(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, global_batch_size=2, warmup_time=3)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, auto=False)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        joiner = await ProtocolClient(app.port, app.run_id, auto=False).connect()
        await poll_until(lambda: len(app.pending) == 3)
        assert len(app.coordinator.epoch_state.clients) == 2
        clients[0].abort()
        # WFM is passed through at once: the pending joiner restores the quorum
        await poll_until(
            lambda: (
                app.run_state == RunState.Warmup
                and joiner.id in {c.id for c in app.coordinator.epoch_state.clients}
            )
        )
        for c in (clients[1], joiner):
            c.auto = True
        await poll_until(lambda: app.run_state == RunState.RoundTrain)
        await poll_until(lambda: app.run_state == RunState.RoundWitness)
        await close_all([*clients, joiner])


async def test_09_finish_epoch(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, global_batch_size=2, epoch_time=4)
    async with running_server(state) as app:
        es = app.coordinator.epoch_state
        assert es.rounds_head == 0 and not es.rounds[0].witnesses
        clients = await start_clients(2, app.port, app.run_id)
        await poll_until(lambda: app.run_state == RunState.Warmup)
        await poll_until(lambda: app.run_state == RunState.RoundTrain)
        await poll_until(lambda: app.run_state == RunState.RoundWitness)
        for head in (1, 2, 3):
            await poll_until(lambda head=head: app.coordinator.epoch_state.rounds_head == head)
        await poll_until(lambda: app.run_state == RunState.Cooldown, timeout=30)
        await poll_until(lambda: app.coordinator.progress.epoch == 1, timeout=5)
        await close_all(clients)


async def test_10_client_join_in_training(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, global_batch_size=2, epoch_time=4)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, train_delay=1.0)
        await poll_until(lambda: app.run_state == RunState.RoundTrain)
        joiner = await ProtocolClient(app.port, app.run_id, train_delay=1.0).connect()
        await poll_until(lambda: len(app.pending) == 3)
        assert len(app.coordinator.epoch_state.clients) == 2
        await poll_until(lambda: app.run_state == RunState.RoundWitness)
        for head in (1, 2):
            await poll_until(lambda head=head: app.coordinator.epoch_state.rounds_head == head)
        assert healthy_score(app, 1) == 2
        await poll_until(lambda: app.coordinator.progress.epoch == 1, timeout=30)
        await poll_until(lambda: app.run_state == RunState.Warmup, timeout=10)
        assert len(app.coordinator.epoch_state.clients) == 3
        await close_all([*clients, joiner])


async def test_11_shutdown_node_in_training_and_complete_round(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "s.toml", init_min_clients=3, global_batch_size=3, witness_nodes=2
    )
    async with running_server(state) as app:
        clients = await start_clients(3, app.port, app.run_id, train_delay=1.0)
        await poll_until(lambda: app.run_state == RunState.RoundTrain)
        clients[0].abort()
        await poll_until(lambda: app.run_state == RunState.RoundWitness)
        await poll_until(lambda: app.run_state == RunState.Cooldown, timeout=15)
        await poll_until(lambda: app.run_state == RunState.WaitingForMembers, timeout=10)
        newcomer = await ProtocolClient(app.port, app.run_id).connect()
        await poll_until(lambda: app.run_state == RunState.Warmup, timeout=10)
        assert len(app.coordinator.epoch_state.clients) == 3
        await close_all([*clients, newcomer])


async def _p2p_joiners(tmp_path: Path, gbs: int, joiners: int, after_height: int) -> None:
    state = write_state(
        tmp_path / "s.toml", init_min_clients=2, global_batch_size=gbs, epoch_time=4
    )
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, train_delay=0.5)
        await poll_until(
            lambda: (
                app.run_state == RunState.RoundTrain
                and app.coordinator.current_round().height == after_height
            ),
            timeout=15,
        )
        late = await start_clients(joiners, app.port, app.run_id, train_delay=0.5)
        await poll_until(lambda: app.coordinator.progress.epoch == 1, timeout=30)
        assert app.coordinator.model.checkpoint.kind == "P2P"
        await poll_until(lambda: app.run_state == RunState.Warmup, timeout=10)
        # the members of epoch 0 are still connected, so the checkpoint stays P2P
        assert app.coordinator.model.checkpoint.kind == "P2P"
        for c in late:
            assert c.peers.keys() >= {x.id for x in clients}, (
                "joiners learn every member's P2P address"
            )
        await poll_until(lambda: app.coordinator.progress.epoch == 2, timeout=30)
        assert len(app.coordinator.epoch_state.clients) == 2 + joiners
        await close_all([*clients, *late])


async def test_12_client_join_in_training_and_get_model_using_p2p(tmp_path: Path) -> None:
    await _p2p_joiners(tmp_path, gbs=3, joiners=1, after_height=0)


async def test_13_two_clients_join_in_training_and_get_model_using_p2p(tmp_path: Path) -> None:
    await _p2p_joiners(tmp_path, gbs=4, joiners=2, after_height=1)


async def test_zero_witness_round_withdraws_everyone(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, max_round_train_time=1)
    async with running_server(state) as app:
        clients = await start_clients(2, app.port, app.run_id, witness=False)
        await poll_until(lambda: app.run_state == RunState.Cooldown, timeout=10)
        assert all(c.state == ClientState.Withdrawn for c in app.coordinator.epoch_state.clients)
        await close_all(clients)

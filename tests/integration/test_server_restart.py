"""`psyche-server run --save-state-dir` as a subprocess: the latest state follows the run step by
step, a SIGKILL mid-epoch loses only the rounds in flight, the same members keep the P2P
checkpoint after the restart, and SIGTERM writes the state before the server exits."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from psyche_common.config import HubCheckpoint, P2PCheckpoint, load_state
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity
from psyche_server.persistence import latest_state_name

from bench.harness.protocol_client import ProtocolClient
from tests.support.server_harness import poll_until, write_state

from .test_server_cli import start_server


async def connect_all(identities: list[Identity], port: int, run_id: str) -> list[ProtocolClient]:
    return [await ProtocolClient(port, run_id, identity).connect() for identity in identities]


async def test_sigkill_mid_epoch_then_restart_resumes_with_the_same_members(
    tmp_path: Path,
) -> None:
    save_dir = tmp_path / "saved"
    state = write_state(
        tmp_path / "s.toml",
        init_min_clients=2,
        global_batch_size=2,
        epoch_time=600,  # the kill happens mid-epoch, long before its end
        warmup_time=1,
        max_round_train_time=2,
    )
    run_id = load_state(state).run_id
    latest = save_dir / latest_state_name(run_id)
    identities = [Identity.generate() for _ in range(2)]
    server = await start_server(tmp_path, "--state", str(state), "--save-state-dir", str(save_dir))
    clients = await connect_all(identities, server.port, run_id)
    seen = await clients[0].wait_for(
        lambda c: c.run_state == RunState.RoundTrain and c.current_round().height >= 4, timeout=60
    )
    # the latest file follows the rounds: it names the step the clients are at
    await poll_until(
        lambda: latest.exists() and load_state(latest).progress.step >= seen.progress.step
    )
    assert await server.stop(signal.SIGKILL) == -signal.SIGKILL  # a crash: no shutdown save
    last = clients[0].coordinator
    assert last is not None
    for client in clients:
        await client.close()

    saved = load_state(latest)
    assert saved.run_state is RunState.WaitingForMembers
    assert saved.progress.epoch == 0
    # nothing but the rounds in flight is lost (the file is written before each broadcast, so
    # the kill may have come between the last write and the clients reading its state)
    ahead = saved.progress.step - last.progress.step
    assert ahead in (0, 1), (saved.progress.step, last.progress.step)
    assert last.run_state in (RunState.RoundTrain, RunState.RoundWitness)
    height = last.current_round().height + ahead
    # rounds h-1 and h were in flight: their data is trained again after the restart
    assert saved.progress.epoch_start_data_index == (height - 1) * 2
    assert isinstance(saved.model.checkpoint, P2PCheckpoint)  # the members hold trained weights
    assert saved.epoch_state is not None
    assert sorted(c.id for c in saved.epoch_state.clients) == sorted(
        i.public_key for i in identities
    )

    restarted = await start_server(
        tmp_path, "--state", str(latest), "--save-state-dir", str(save_dir), name="restarted"
    )
    clients = await connect_all(identities, restarted.port, run_id)
    warmup = await clients[0].wait_for(lambda c: c.run_state == RunState.Warmup, timeout=20)
    assert warmup.progress.step == saved.progress.step
    # the same members are back: they serve the model to each other, not the initial weights
    assert isinstance(warmup.model.checkpoint, P2PCheckpoint)
    first = await clients[0].wait_for(lambda c: c.run_state == RunState.RoundTrain, timeout=20)
    assert first.current_round().data_index == saved.progress.epoch_start_data_index
    await clients[0].wait_for(lambda c: c.progress.step >= saved.progress.step + 2, timeout=40)
    assert await restarted.stop() == 0
    for client in clients:
        await client.close()


async def test_restart_with_other_members_falls_back_to_the_hub(tmp_path: Path) -> None:
    save_dir = tmp_path / "saved"
    state = write_state(
        tmp_path / "s.toml", init_min_clients=2, global_batch_size=2, epoch_time=600, warmup_time=1
    )
    run_id = load_state(state).run_id
    latest = save_dir / latest_state_name(run_id)
    server = await start_server(tmp_path, "--state", str(state), "--save-state-dir", str(save_dir))
    clients = await connect_all([Identity.generate() for _ in range(2)], server.port, run_id)
    await clients[0].wait_for(lambda c: c.current_round().height >= 3, timeout=60)
    await poll_until(lambda: isinstance(load_state(latest).model.checkpoint, P2PCheckpoint))
    assert await server.stop(signal.SIGKILL) == -signal.SIGKILL
    for client in clients:
        await client.close()

    restarted = await start_server(tmp_path, "--state", str(latest), name="restarted")
    strangers = await connect_all([Identity.generate() for _ in range(2)], restarted.port, run_id)
    warmup = await strangers[0].wait_for(lambda c: c.run_state == RunState.Warmup, timeout=20)
    assert isinstance(warmup.model.checkpoint, HubCheckpoint)  # nobody holds the model
    assert await restarted.stop() == 0
    for client in strangers:
        await client.close()


async def test_sigterm_writes_the_state_before_exiting(tmp_path: Path) -> None:
    save_dir = tmp_path / "saved"
    state = write_state(tmp_path / "s.toml", init_min_clients=3, warmup_time=20)
    run_id = load_state(state).run_id
    latest = save_dir / latest_state_name(run_id)
    server = await start_server(
        tmp_path,
        "--state",
        str(state),
        "--save-state-dir",
        str(save_dir),
        "--init-warmup-time",
        "7",
        "--log-format",
        "json",
    )
    client = await ProtocolClient(server.port, run_id).connect()
    await client.wait_for(lambda c: c.run_state == RunState.WaitingForMembers, timeout=10)
    await poll_until(latest.exists)  # written at startup...
    latest.unlink()  # ...so only the shutdown can write it again
    assert await server.stop(signal.SIGTERM) == 0
    await client.close()

    saved = load_state(latest)
    assert saved.run_state is RunState.WaitingForMembers
    assert saved.progress.step == 1
    assert saved.config.warmup_time == 20  # the file's own, not --init-warmup-time
    lines = [json.loads(line) for line in server.stderr_path.read_text().splitlines() if line]
    shutdown = [e for e in lines if e["msg"].startswith("saved state on shutdown")]
    assert shutdown and shutdown[0]["path"] == str(latest)
    assert lines[-1]["msg"] == "server stopped"

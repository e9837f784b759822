"""End-to-end: a real server and real client processes on loopback.

Protocol-level scenarios use the dummy backend (`--dummy-training-delay-secs`); the real
training scenario trains builtin:llama-tiny on CPU with DisTrO.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, applied_hashes, losses, wait_for, write_state
from tests.e2e.wandb_run import WANDB_FLAGS, assert_offline_wandb_runs, wandb_env

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def cluster(tmp_path: Path):
    made: list[Cluster] = []

    def make(**state) -> Cluster:
        c = Cluster(tmp_path, write_state(tmp_path / "state.toml", **state))
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def assert_same_hashes(procs, min_common: int) -> list[int]:
    tables = [applied_hashes(p) for p in procs]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    assert len(common) >= min_common, f"only {len(common)} common applied steps"
    for step in common:
        assert len({t[step] for t in tables}) == 1, f"weights differ at step {step}"
    return common


def test_real_training_three_clients_loss_decreases_identical_weights(cluster) -> None:
    c = cluster(total_steps=12, epoch_time=600)
    c.start_server()
    checkpoints = c.tmp / "checkpoints"
    clients = [c.start_client("--checkpoint-dir", str(checkpoints))] + [
        c.start_client() for _ in range(2)
    ]
    wait_for(
        lambda: all(p.popen.poll() is not None for p in clients),
        300,
        "all clients to finish the run",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in clients] == [0, 0, 0], c.diagnostics()
    common = assert_same_hashes(clients, min_common=8)
    assert common[-1] >= 11
    for proc in clients:
        by_step = losses(proc)
        steps = sorted(by_step)
        first = sum(by_step[s] for s in steps[:3]) / 3
        last = sum(by_step[s] for s in steps[-3:]) / 3
        assert last < first - 0.3, f"{proc.name}: loss {first:.3f} -> {last:.3f}"
    # the checkpoint written at cooldown loads with transformers and holds the final weights
    from psyche_client.training.trainer import weights_digest
    from transformers import AutoModelForCausalLM

    saved = sorted(checkpoints.glob("e2e-run-step*"))
    assert saved, f"no checkpoint in {checkpoints}"
    model = AutoModelForCausalLM.from_pretrained(saved[-1])
    assert weights_digest(model).hex() == applied_hashes(clients[0])[common[-1]]


def test_two_bf16_clients_hold_identical_weights(cluster, monkeypatch) -> None:
    """`--dtype bf16` (with fp32 gradient accumulation over two micro-batches): two real
    clients apply the same results to bf16 weights bit-identically, and the checkpoint holds
    those bf16 bytes. The same run checks `--wandb-project` and `--optim-stats-steps` (offline
    wandb runs: tests/e2e/wandb_run.py)."""
    import torch

    c = cluster(total_steps=7, init_min_clients=2, batch=4, epoch_time=600)
    home = c.tmp / "wandb-home"
    home.mkdir()
    wandb_env(monkeypatch, home, "offline")
    c.start_server()
    checkpoints = c.tmp / "checkpoints"
    flags = ("--dtype", "bf16", "--grad-accum-in-fp32", "--micro-batch-size", "1", *WANDB_FLAGS)
    clients = [
        c.start_client(*flags, "--checkpoint-dir", str(checkpoints)),
        c.start_client(*flags),
    ]
    wait_for(
        lambda: all(p.popen.poll() is not None for p in clients),
        300,
        "both clients to finish the run",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in clients] == [0, 0], c.diagnostics()
    common = assert_same_hashes(clients, min_common=3)
    from psyche_client.training.trainer import weights_digest
    from transformers import AutoModelForCausalLM

    saved = sorted(checkpoints.glob("e2e-run-step*"))
    assert saved, f"no checkpoint in {checkpoints}"
    model = AutoModelForCausalLM.from_pretrained(saved[-1], dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    # the hash covers the dtype: equal hashes mean the clients trained bf16 weights
    assert weights_digest(model).hex() == applied_hashes(clients[0])[common[-1]]
    assert_offline_wandb_runs(clients, home)


def test_sigkill_mid_round_does_not_stall_the_run(cluster) -> None:
    # every client is a witness (quorum 2 of 3), so losing any one client - even a witness -
    # leaves a quorum and the epoch goes on (with witness_nodes = 1, killing the only witness
    # ends the epoch, as in the reference)
    c = cluster(total_steps=14, epoch_time=600, max_round_train_time=6, witness_nodes=0)
    c.start_server()
    gradients, log_file = c.tmp / "gradients", c.tmp / "client0-copy.log"
    clients = [
        c.start_client(
            "--write-gradients-dir",
            str(gradients),
            "--write-log",
            str(log_file),
            dummy_delay=0.3,
        )
    ] + [c.start_client(dummy_delay=0.3) for _ in range(2)]
    wait_for(lambda: len(applied_hashes(clients[0])) >= 2, 120, "training to start", c.diagnostics)
    victim = clients[2]
    victim.kill(signal.SIGKILL)
    survivors = clients[:2]
    wait_for(
        lambda: all(p.popen.poll() is not None for p in survivors),
        200,
        "the survivors to finish the run",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in survivors] == [0, 0], c.diagnostics()
    common = assert_same_hashes(survivors, min_common=8)
    assert common[-1] >= 13
    written = list(gradients.glob("result-*-step*-batch*.bin"))
    assert len(written) >= 8 and all(p.stat().st_size == 64 for p in written)
    assert '"applied step"' in log_file.read_text()


@pytest.mark.slow
def test_late_joiner_fetches_model_peer_to_peer_and_trains_identically(cluster) -> None:
    c = cluster(total_steps=40, warmup_time=20, epoch_time=30, cooldown_time=4)
    c.start_server()
    first = [c.start_client() for _ in range(3)]
    wait_for(
        lambda: len(applied_hashes(first[0])) >= 1, 150, "the first epoch to train", c.diagnostics
    )
    joiner = c.start_client()
    wait_for(
        lambda: joiner.events("model fetched peer-to-peer"),
        200,
        "the joiner to fetch the model",
        c.diagnostics,
    )
    fetched = joiner.events("model fetched peer-to-peer")[0]
    assert fetched["bytes"] > 0
    wait_for(lambda: joiner.events("model ready"), 60, "the joiner's model", c.diagnostics)
    assert joiner.events("model ready")[0]["model_source"] == "p2p"  # config from peers too
    wait_for(
        lambda: len(applied_hashes(joiner)) >= 3, 150, "the joiner to apply steps", c.diagnostics
    )
    joined = applied_hashes(joiner)
    for proc in first:
        theirs = applied_hashes(proc)
        for step, value in joined.items():
            if step in theirs:
                assert theirs[step] == value, f"joiner differs from {proc.name} at {step}"
    # the model it fetched is the one the others held at the end of the first epoch
    epoch0_last = max(s for s in applied_hashes(first[0]) if s < min(joined))
    assert fetched["weights_hash"] == applied_hashes(first[0])[epoch0_last]


async def test_corrupted_blobs_are_detected_and_never_applied(cluster) -> None:
    """Three in-process clients (real P2P nodes, dummy backend) against a real server; one
    client's node serves every blob with a flipped byte. Its own results can be fetched from
    nobody else, so no witness quorum sees them and they are never applied; honest clients
    keep identical weights and finish the run."""
    import asyncio

    from psyche_client.app import ClientApp, ClientOptions, ServerOptions
    from psyche_client.app.options import client_p2p_config
    from psyche_client.weights.backends import BackendOptions
    from psyche_common.protocol import Identity

    c = cluster(total_steps=10, witness_nodes=0, max_round_train_time=8)
    c.start_server()
    apps = []
    for _ in range(3):
        options = ClientOptions(
            ServerOptions(f"127.0.0.1:{c.port}", "e2e-run"),
            Identity.generate(),
            p2p=client_p2p_config(bind_host="127.0.0.1", advertise_host="127.0.0.1"),
            backend=BackendOptions(dummy_delay_secs=0.1),
        )
        apps.append(ClientApp(options))
    bad = apps[0]
    store = bad.node.blobs
    honest_get = store.get

    def corrupt_get(digest: bytes) -> bytes | None:
        data = honest_get(digest)
        return None if data is None else bytes([data[0] ^ 0xFF]) + data[1:]

    store.get = corrupt_get  # type: ignore[method-assign]
    codes = await asyncio.wait_for(asyncio.gather(*(app.run() for app in apps)), 300)
    assert codes[1:] == [0, 0]
    honest = apps[1:]
    assert sum(app.node.stats.downloads.corrupt for app in honest) > 0
    tables = [app.stats.weights_hashes for app in honest]
    common = sorted(set(tables[0]) & set(tables[1]))
    assert len(common) >= 5
    assert all(tables[0][s] == tables[1][s] for s in common)
    bad_id = bad.identity.public_key
    for app in honest:
        runner = app.runner
        assert runner is not None and runner.fatal is None
        assert bad_id not in app.stats.applied_senders
        assert len(app.stats.applied_senders) == 2


@pytest.mark.slow
def test_state_toml_example_trains_as_shipped(tmp_path: Path, repo_root: Path) -> None:
    """The shipped state.toml.example: one server, three clients, CPU, no network; the first
    applied steps have identical weights on every client and the loss falls."""
    c = Cluster(tmp_path, repo_root / "state.toml.example")
    try:
        c.start_server()
        clients = [c.start_client(run_id="tiny-cpu-demo") for _ in range(3)]
        wait_for(
            lambda: all(len(applied_hashes(p)) >= 6 for p in clients),
            600,
            "six applied steps on every client",
            c.diagnostics,
        )
        assert_same_hashes(clients, min_common=6)
        by_step = losses(clients[0])
        steps = sorted(by_step)
        assert by_step[steps[-1]] < by_step[steps[0]]
    finally:
        c.stop()


@pytest.mark.slow
def test_sparseloco_example_trains_as_shipped(tmp_path: Path, repo_root: Path) -> None:
    """state.sparseloco.toml.example through real processes: SparseLoCo results travel,
    every client applies them to identical weights and the loss falls."""
    c = Cluster(tmp_path, repo_root / "state.sparseloco.toml.example")
    try:
        c.start_server()
        clients = [c.start_client(run_id="tiny-cpu-sparseloco") for _ in range(3)]
        wait_for(
            lambda: all(len(applied_hashes(p)) >= 6 for p in clients),
            600,
            "six applied steps on every client",
            c.diagnostics,
        )
        assert_same_hashes(clients, min_common=6)
        by_step = losses(clients[0])
        steps = sorted(by_step)
        assert by_step[steps[-1]] < by_step[steps[0]]
    finally:
        c.stop()

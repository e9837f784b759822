"""A run that survives: one consensus for everyone, self-healing weights (real processes).

- A selective announcer (tests/e2e/selective_client.py) tells only one peer of each of its
  results; gossip carries them to everyone, so every client applies the same results.
- A client whose process is frozen (SIGSTOP: both its links dead) for longer than a round is
  dropped, joins again and, at the next Warmup, resyncs its weights from its peers; from then
  on its weights hash equals every peer's at every step.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from psyche_common.protocol import Identity

from bench.harness.client_run import Cluster, applied_hashes, wait_for, write_state

pytestmark = pytest.mark.timeout(300)

SELECTIVE = [sys.executable, str(Path(__file__).with_name("selective_client.py"))]


def test_a_selective_announcer_cannot_split_honest_clients(tmp_path: Path) -> None:
    c = Cluster(tmp_path, write_state(tmp_path / "state.toml", total_steps=12, witness_nodes=2))
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(2)]
        selective = c.start_client(dummy_delay=0.3, program=SELECTIVE)
        clients = [*honest, selective]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in clients),
            200,
            "the run to finish",
            c.diagnostics,
        )
        assert [p.popen.returncode for p in clients] == [0, 0, 0], c.diagnostics()
        tables = [applied_hashes(p) for p in honest]
        common = sorted(set(tables[0]) & set(tables[1]))
        assert len(common) >= 8, f"only {len(common)} common applied steps"
        for step in common:
            assert tables[0][step] == tables[1][step], f"honest clients differ at step {step}"
        # and the selective client's results were applied by both (nobody skipped them)
        for proc in honest:
            applied = proc.events("applied step")
            assert applied and all(event["results"] == 3 for event in applied[1:]), applied
    finally:
        c.stop()


def test_a_frozen_client_resyncs_and_then_matches_its_peers(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=60,
        epoch_time=16,
        max_round_train_time=3,
        warmup_time=10,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=3,  # quorum 2: a frozen witness does not end the epoch
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        clients = [c.start_client(dummy_delay=0.3) for _ in range(4)]
        frozen = clients[3]
        wait_for(lambda: len(applied_hashes(frozen)) >= 3, 90, "a few applied steps")
        frozen.popen.send_signal(signal.SIGSTOP)  # its server and P2P links go silent
        time.sleep(10)  # several rounds: its peers drop it and go on without it
        frozen.popen.send_signal(signal.SIGCONT)
        wait_for(
            lambda: frozen.events("weights resynced from peers"),
            120,
            "the frozen client to resync",
            c.diagnostics,
        )
        resynced_at = frozen.events("weights resynced from peers")[0]["step"]
        wait_for(
            lambda: len([s for s in applied_hashes(frozen) if s > resynced_at]) >= 4,
            120,
            "steps after the resync",
            c.diagnostics,
        )
        mine = applied_hashes(frozen)
        peers = [applied_hashes(p) for p in clients[:3]]
        after = [step for step in sorted(mine) if step > resynced_at]
        compared = 0
        for step in after:
            for table in peers:
                if step in table:
                    assert table[step] == mine[step], f"weights differ at step {step}"
                    compared += 1
        assert compared >= 4, f"only {compared} comparisons after the resync"
    finally:
        c.stop()


def test_a_redeployed_run_goes_on_from_the_stored_checkpoint(tmp_path: Path) -> None:
    """The server and every client are killed mid-epoch and started again (a redeploy, a power
    cut): the server from its saved state, whose checkpoint is peer-to-peer, the clients with
    their keys but no weights. Their Joins say they hold none, so the next epoch loads the
    stored checkpoint instead of waiting for ever for peers that hold nothing (each joiner used
    to fail 'no peer answered with a model manifest' and exit, epoch after epoch)."""
    state = write_state(
        tmp_path / "state.toml",
        total_steps=100,
        epoch_time=300,
        max_round_train_time=3,
        init_min_clients=2,
        min_clients=2,
    )
    keys = []
    for index in range(2):
        key = tmp_path / f"client{index}.key"
        key.write_bytes(Identity.generate().secret_bytes())
        keys.append(str(key))
    saved = tmp_path / "saved"
    c = Cluster(tmp_path, state)
    try:
        c.start_server("--save-state-dir", str(saved))
        first = [c.start_client("--identity-secret-key-path", k, dummy_delay=0.3) for k in keys]
        wait_for(
            lambda: all(len(applied_hashes(p)) >= 3 for p in first),
            90,
            "a few applied steps",
            c.diagnostics,
        )
        assert c.server is not None
        for proc in [c.server, *first]:
            proc.kill(signal.SIGKILL)
            proc.popen.wait(10)
        latest = saved / "e2e-run-latest.toml"
        assert "[model.LLM.checkpoint.P2P]" in latest.read_text()
        trained_before = max(max(applied_hashes(p)) for p in first)
        server = c.start_server("--save-state-dir", str(saved), state=latest, name="restarted")
        again = [c.start_client("--identity-secret-key-path", k, dummy_delay=0.3) for k in keys]
        wait_for(
            lambda: all(any(step > trained_before for step in applied_hashes(p)) for p in again),
            90,
            "both restarted clients to train again",
            c.diagnostics,
        )
        for proc in again:
            assert proc.popen.poll() is None, proc.tail()
        joins = [
            line
            for line in server.lines()
            if str(line.get("msg", "")).endswith("without the run's weights yet)")
        ]
        assert len(joins) >= 2, "the restarted clients' Joins say they hold no weights"
    finally:
        c.stop()

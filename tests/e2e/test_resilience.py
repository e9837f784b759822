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

from tests.e2e.client_run import Cluster, applied_hashes, wait_for, write_state

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

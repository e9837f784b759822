"""Forged weights-hash majorities (real processes; issue 18, finding 1).

Keys are free: five fresh identities that never join open the coordinator port, complete the
handshake, report one made-up weights hash for each of the next 64 steps in `HealthCheck`s
and close, again and again while the run trains. The server counts only the epoch's members,
so the three honest clients are never told their weights differ, never go out of sync, keep
training and end with identical weights at every step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, finish_in_agreement, write_state
from bench.harness.hostile_hosts import FORGED_STEPS, HashForger

pytestmark = pytest.mark.timeout(300)

FORGERS = 5


def test_keys_that_never_joined_cannot_outvote_the_members(tmp_path: Path) -> None:
    c = Cluster(tmp_path, write_state(tmp_path / "state.toml", total_steps=12))
    forgers: HashForger | None = None
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        forgers = HashForger(c.port, "e2e-run", keys=FORGERS)
        forgers.start()
        common = finish_in_agreement(c, honest, min_common=8)
        assert forgers.sent >= FORGERS * FORGED_STEPS, forgers.sent  # the forged reports went out
        server = c.server
        assert server is not None
        assert not server.events_with("majority_hash"), "the server flagged an honest client"
        for proc in honest:
            assert not [
                line for line in proc.lines() if "out of sync" in str(line.get("msg", ""))
            ], proc.tail()
            trained = proc.events("trained step")
            assert len(trained) >= len(common) - 2, (proc.name, len(trained), common)
    finally:
        if forgers is not None:
            forgers.stop()
        c.stop()

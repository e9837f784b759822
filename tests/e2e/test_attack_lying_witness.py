"""A lying witness (real processes): a member that sends all-ones blooms as every witness and
accuses every trainer in every health check (tests/e2e/lying_client.py). The coordinator
refuses its witnesses (no honest bloom can set that many bits) and its accusations of
healthy clients, so it decides no consensus and drops nobody: the honest clients are never
dropped and hold identical weights at every step. Both lies are proven by the liar's own
messages, so the coordinator drops it (`coordinator.misconduct`): a false accuser with honest
blooms (tests/e2e/accuser_client.py) at its second refused health check. What a liar still
costs until then: a round whose witness quorum counts on its refused witness lasts until
`max_round_train_time`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, finish_in_agreement, write_state

pytestmark = pytest.mark.timeout(300)

LIAR = [sys.executable, str(Path(__file__).with_name("lying_client.py"))]
ACCUSER = [sys.executable, str(Path(__file__).with_name("accuser_client.py"))]
DROPPED = "dropped from the epoch by a health check: joining again for the next epoch"


@pytest.mark.parametrize("program", [LIAR, ACCUSER], ids=["all_ones_blooms", "false_accuser"])
def test_a_lying_witness_decides_nothing_drops_nobody_and_is_removed(
    tmp_path: Path, program: list[str]
) -> None:
    # witness_nodes = 0: every member witnesses every round, the liar included
    # rounds whose quorum needs the liar's refused witness run to max_round_train_time
    state = write_state(
        tmp_path / "state.toml",
        total_steps=12,
        init_min_clients=4,
        witness_nodes=0,
        max_round_train_time=4,
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        liar = c.start_client(dummy_delay=0.3, program=program)
        finish_in_agreement(c, honest, min_common=6)
        for proc in honest:
            assert not proc.events(DROPPED), f"{proc.name} was dropped\n{c.diagnostics()}"
        assert c.server is not None
        log = c.server.log_path.read_text(errors="replace")
        if program is LIAR:  # dropped at its first witness, maybe before any health check
            assert "bits set" in log, "the liar's witnesses were not refused"
        else:
            assert "accused healthy client" in log, "the liar's health checks were not refused"
        assert liar.events(DROPPED), f"the liar was not removed\n{c.diagnostics()}"
    finally:
        c.stop()

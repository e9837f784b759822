"""An equivocator (real processes): a trainer that signs two different results for each of
its batches and pushes one to each half of the other members (tests/e2e/equivocator_client.py).

Every honest inbox keeps and forwards the second commitment, so all of them learn both; the
first to hold both sends the pair to the server, whose coordinator checks both signatures and
drops the trainer (the proof needs no quorum: an honest trainer signs one result per batch).
Every honest client then skips its results that were not final yet, whichever commitment it
saw first: the honest weights hashes agree at every applied step, none of the equivocator's
results is applied, and the equivocator is removed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.attack_run import client_id
from bench.harness.client_run import Cluster, finish_in_agreement, write_state

pytestmark = pytest.mark.timeout(300)

EQUIVOCATOR = [sys.executable, str(Path(__file__).with_name("equivocator_client.py"))]


def test_an_equivocator_is_removed_and_splits_nobody(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=12,
        init_min_clients=5,
        min_clients=3,
        witness_nodes=0,  # every member witnesses: each half holds two of the four honest
        max_round_train_time=5,
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(4)]
        attacker = c.start_client(dummy_delay=0.3, program=EQUIVOCATOR)
        finish_in_agreement(c, honest, min_common=6)
        assert attacker.events("equivocator: announced two commitments"), c.diagnostics()
        bad = client_id(attacker)
        assert c.server is not None
        convictions = [
            line
            for line in c.server.lines()
            if str(line.get("msg", "")).startswith("conviction:") and line.get("client") == bad
        ]
        assert convictions, f"the equivocator {bad} was not removed\n{c.diagnostics()}"
        assert convictions[0]["conviction_kind"] == "proven", convictions
        applied = [e for p in honest for e in p.events("applied step") if bad in e["senders"]]
        assert applied == [], f"results of the equivocator were applied: {applied}"
    finally:
        c.stop()

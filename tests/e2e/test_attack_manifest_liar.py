"""A manifest liar (real processes): a member that serves late joiners a manifest and
parameters of other weights than it holds (tests/e2e/manifest_liar_client.py).

A joiner in the next epoch polls every member's manifest and trusts only the model that a
majority of the answers and at least two peers vouch for (`p2p.model_share`): the three
honest members outvote the liar, its manifest is noted as disagreeing, and no parameter is
fetched from it. The joiner loads the honest weights and trains in step with the honest
members. The liar is not removed: a manifest is an unsigned answer to one peer, so the joiner
holds nothing it could prove to the coordinator (docs/security.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.client_run import (
    Cluster,
    applied_hashes,
    finish_in_agreement,
    wait_for,
    write_state,
)

pytestmark = pytest.mark.timeout(300)

LIAR = [sys.executable, str(Path(__file__).with_name("manifest_liar_client.py"))]


def test_a_joiner_outvotes_a_manifest_liar(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=16,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=0,
        max_round_train_time=5,
        epoch_time=8,
        cooldown_time=2,
        warmup_time=5,
    )
    c = Cluster(tmp_path, state)
    model = ("--dummy-model-size", "65536")
    try:
        c.start_server()
        honest = [c.start_client(*model, dummy_delay=0.3) for _ in range(3)]
        liar = c.start_client(*model, dummy_delay=0.3, program=LIAR)
        wait_for(lambda: applied_hashes(honest[0]), 120, "the first epoch to train", c.diagnostics)
        joiner = c.start_client(*model, dummy_delay=0.3)
        wait_for(
            lambda: joiner.events("model fetched peer-to-peer"),
            120,
            "the joiner to fetch the model",
            c.diagnostics,
        )
        assert liar.events("manifest_liar: served a lying manifest"), c.diagnostics()
        poll = [line for line in joiner.lines() if "disagrees with the majority" in str(line)]
        assert poll, "the liar's manifest was not set aside"
        finish_in_agreement(c, [*honest, joiner], min_common=3)
        fetched = joiner.events("model fetched peer-to-peer")[0]
        joined = applied_hashes(joiner)
        before = max(s for s in applied_hashes(honest[0]) if s < min(joined))
        assert fetched["weights_hash"] == applied_hashes(honest[0])[before]
    finally:
        c.stop()

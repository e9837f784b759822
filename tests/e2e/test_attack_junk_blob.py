"""A junk-blob server (real processes): a member that announces one honest commitment per
result but serves junk bytes of the right size to half of the other members
(tests/e2e/junk_blob_client.py).

The announcement binds the exact blob (`blob_hash`), so a victim's fetch rejects the junk at
the hash check and asks the next member that holds the blob: every honest client applies the
same results, the attacker's included, and nobody is split. The attacker is not removed: a
victim cannot show anyone else what it was sent (served bytes carry no signature), so the lie
is not provable (docs/security.md bounds its cost: one wasted transfer per blob and victim).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.attack_run import client_id
from bench.harness.client_run import Cluster, finish_in_agreement, write_state

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # about a minute

JUNK = [sys.executable, str(Path(__file__).with_name("junk_blob_client.py"))]


def test_junk_blobs_are_refused_and_the_victims_apply_the_real_result(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=10,
        init_min_clients=4,
        witness_nodes=0,
        max_round_train_time=5,
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        attacker = c.start_client(dummy_delay=0.3, program=JUNK)
        finish_in_agreement(c, honest, min_common=5)
        junk = attacker.events("junk blob: served junk")
        assert junk, f"the attacker served no junk\n{c.diagnostics()}"
        victims = {line["victim"] for line in junk}
        bad = client_id(attacker)
        by_id = {client_id(p): p for p in honest}
        for victim in victims:
            proc = by_id[victim]
            lines = proc.log_path.read_text(errors="replace")
            assert "served corrupted bytes" in lines, f"{victim} never saw the junk"
            applied = [e for e in proc.events("applied step") if bad in e["senders"]]
            assert applied, f"victim {victim} applied none of the attacker's results"
    finally:
        c.stop()

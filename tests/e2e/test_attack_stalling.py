"""A stalling peer (real processes): a member whose P2P node completes handshakes and then
never answers (tests/e2e/stalling_client.py) cannot split its peers. Pushing an announcement
to it waits at most `announce_wait` (1 s) inside the round, the rest finishes in the
background; its blobs cannot be fetched, so no witness vouches for its results, every honest
client applies the same results without them, and the witnesses' health checks drop it.

What it still costs (as in the reference): it never sends Finished, so the rounds it is a
member of last until `max_round_train_time`; once dropped it can join again next epoch. And
as a witness it attests nothing, so a committee of 2 witnesses (quorum 2) with it cannot
approve any result, and the honest members then fail the health checks that follow: runs
need at least 3 witnesses per round to tolerate one such member (3 here).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, finish_in_agreement, write_state

pytestmark = pytest.mark.timeout(300)

STALLING = [sys.executable, str(Path(__file__).with_name("stalling_client.py"))]


def test_a_stalling_peer_neither_delays_nor_splits_honest_clients(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=14,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=3,  # quorum 2 of 3: one withholding witness cannot block consensus
        max_round_train_time=5,
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        c.start_client(dummy_delay=0.3, program=STALLING)
        common = finish_in_agreement(c, honest, min_common=6)
        counts = [{e["step"]: e["results"] for e in p.events("applied step")} for p in honest]
        for step in common:  # the same results everywhere, never the stalling peer's
            assert counts[0][step] == counts[1][step] == counts[2][step] <= 3, (step, counts)
        assert c.server is not None
        dropped = [e for e in c.server.events_with("dropped") if e["dropped"] >= 1]
        assert dropped, "no health check dropped the stalling peer"
    finally:
        c.stop()

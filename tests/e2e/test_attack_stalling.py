"""A stalling peer (real processes): a member whose P2P node completes handshakes and then
never answers (tests/e2e/stalling_client.py) cannot hold the rounds of its peers or split
them. Pushing an announcement waits at most `announce_wait` (1 s) inside the round, the rest
finishes in the background; its blobs cannot be fetched, so no witness vouches for its
results and every honest client applies the same results without them.
"""

from __future__ import annotations

import itertools
import statistics
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.client_run import Cluster, applied_hashes, wait_for, write_state

pytestmark = pytest.mark.timeout(300)

STALLING = [sys.executable, str(Path(__file__).with_name("stalling_client.py"))]


def test_a_stalling_peer_neither_delays_nor_splits_honest_clients(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml", total_steps=12, init_min_clients=4, witness_nodes=2
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        c.start_client(dummy_delay=0.3, program=STALLING)
        wait_for(
            lambda: all(p.popen.poll() is not None for p in honest),
            240,
            "the honest clients to finish",
            c.diagnostics,
        )
        assert [p.popen.returncode for p in honest] == [0, 0, 0], c.diagnostics()
        tables = [applied_hashes(p) for p in honest]
        common = sorted(set(tables[0]) & set(tables[1]) & set(tables[2]))
        assert len(common) >= 8, f"only {len(common)} common applied steps\n{c.diagnostics()}"
        for step in common:
            assert tables[0][step] == tables[1][step] == tables[2][step], f"differ at {step}"
        counts = [{e["step"]: e["results"] for e in p.events("applied step")} for p in honest]
        for step in common:  # the same results everywhere, never the stalling peer's
            assert counts[0][step] == counts[1][step] == counts[2][step] <= 3, (step, counts)
        times = [datetime.fromisoformat(e["ts"]) for e in honest[0].events("applied step")]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        # a round lasts its training (0.3 s) plus witnessing, not a push timeout per round
        assert gaps and statistics.median(gaps) < 4.5, gaps
    finally:
        c.stop()

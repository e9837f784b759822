"""Floods by a member over P2P (real processes): far-future announcements
(tests/e2e/early_flood_client.py) and a slow reader holding serving slots
(tests/e2e/slow_reader_client.py).

The early flood costs each peer at most its burst plus 64 signature checks a second (over
the rate the announcements are answered `deferred` before any check), none of them is kept
or forwarded (they are beyond the next 2 steps), and the honest clients train in step. The
slow reader holds at most `max_serving_per_peer` (4) of each peer's 32 serving slots, so
every fresh result (1 MiB here, several chunks) is still fetched and no honest trainer is
dropped. Neither attacker is removed (docs/security.md, "Cheap floods", says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.attack_run import DROPPED_LINE
from bench.harness.client_run import Cluster, finish_in_agreement, write_state

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent
EARLY_FLOOD = [sys.executable, str(HERE / "early_flood_client.py")]
SLOW_READER = [sys.executable, str(HERE / "slow_reader_client.py")]


def test_an_early_flood_is_rated_and_kept_by_nobody(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=8,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=0,
        max_round_train_time=5,
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server()
        # a low rate, so that this machine's flood (about 60 pushes a second to each peer,
        # bounded by the round trips) exceeds it: the default is 64 a second after 512
        rated = ("--p2p-announcement-rate", "5")
        honest = [c.start_client(*rated, dummy_delay=0.3) for _ in range(3)]
        attacker = c.start_client(dummy_delay=0.3, program=EARLY_FLOOD)
        finish_in_agreement(c, honest, min_common=5)
        floods = attacker.events("early_flood: pushed")
        assert floods, c.diagnostics()
        statuses = [f["flood_statuses"] for f in floods]
        assert all(s.get("accepted", 0) == 0 for s in statuses), statuses  # none kept
        assert sum(s.get("deferred", 0) for s in statuses) >= 3 * 1200, statuses
        # more than a burst at once from one peer: the rest deferred before any check
        assert sum(f["rate_deferred"] for f in floods) > 0, statuses
        for proc in honest:
            assert not proc.events(DROPPED_LINE), f"{proc.name} was dropped"
    finally:
        c.stop()


@pytest.mark.slow  # 35-50 s on a loaded 2-core machine (1 MiB results); the mechanism runs in
# make test too: tests/integration/test_p2p_serving_slots.py
def test_a_slow_reader_cannot_keep_fresh_results_from_being_fetched(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=9,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=0,
        max_round_train_time=5,
    )
    c = Cluster(tmp_path, state)
    big = ("--dummy-result-size", str(1024 * 1024))
    try:
        c.start_server()
        honest = [c.start_client(*big, dummy_delay=0.3) for _ in range(3)]
        attacker = c.start_client(*big, dummy_delay=0.3, program=SLOW_READER)
        common = finish_in_agreement(c, honest, min_common=6)
        assert attacker.events("slow_reader: holding requests"), c.diagnostics()
        held_from = min(e["step"] for e in attacker.events("slow_reader: holding requests"))
        late = [s for s in common if s > held_from + 2]
        assert late, (held_from, common)
        # every result an honest trainer finished is still fetched and applied by every honest
        # client while the slow reader holds slots. (A trainer whose own round ran out because
        # the attacker served its own result slowly has no result to fetch: that cost is the
        # slow first announcer's, tests/e2e/test_attack_stall_peers.py.)
        trained = {(e["client_id"], e["step"]) for p in honest for e in p.events("trained step")}
        for proc in honest:
            for applied in proc.events("applied step"):
                if applied["step"] not in late:
                    continue
                source = applied["applied_from_step"]
                fresh = {cid for cid, step in trained if step == source}
                assert fresh, (proc.name, applied)
                missing = fresh - set(applied["senders"])
                assert not missing, (proc.name, applied["step"], missing, applied["senders"])
        for proc in honest:
            assert not proc.events(DROPPED_LINE), f"{proc.name} was dropped"
    finally:
        c.stop()

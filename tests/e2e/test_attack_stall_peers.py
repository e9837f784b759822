"""Members who try to stall their peers over P2P (real processes, issue 29 findings 5, 8, 9):
a frame bomber (tests/e2e/frame_bomb_client.py), a Finished flooder
(tests/e2e/finished_flood_client.py) and a trainer serving its blobs a byte at a time
(tests/e2e/slow_first_announcer_client.py).

Each runs beside three honest clients, which must train to the end with identical weights
hashes and none of them dropped. The bombs are refused and their links closed at once; the
flood's Finished are refused (one per sender and step is taken, and nobody forwards the rest);
the slow trainer's results are never fetched in time, so the honest clients apply the others'
(its own removal is the witnesses' health checks', as for a stalling peer).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.attack_run import DROPPED_LINE
from tests.e2e.client_run import Cluster, Proc, finish_in_agreement, write_state

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent


def run_beside_three_honest(tmp_path: Path, program: str) -> tuple[Cluster, list[Proc], Proc]:
    state = write_state(
        tmp_path / "state.toml",
        total_steps=8,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=0,
        max_round_train_time=5,
    )
    c = Cluster(tmp_path, state)
    c.start_server()
    honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
    attacker = c.start_client(dummy_delay=0.3, program=[sys.executable, str(HERE / program)])
    return c, honest, attacker


def assert_nobody_honest_dropped(honest: list[Proc]) -> None:
    for proc in honest:
        assert not proc.events(DROPPED_LINE), f"{proc.name} was dropped"


def test_frame_bombs_are_refused_at_once_and_their_links_closed(tmp_path: Path) -> None:
    c, honest, attacker = run_beside_three_honest(tmp_path, "frame_bomb_client.py")
    try:
        finish_in_agreement(c, honest, min_common=5)
        bombs = attacker.events("frame_bomb: sent")
        assert bombs, c.diagnostics()
        assert sum(b["closed"] for b in bombs) >= 3, bombs  # at least one round of three
        assert all(b["open"] == 0 for b in bombs), bombs
        assert max(b["slowest_close_s"] for b in bombs) < 1.0, bombs
        assert_nobody_honest_dropped(honest)
    finally:
        c.stop()


def test_a_finished_flood_is_refused_and_forwarded_by_nobody(tmp_path: Path) -> None:
    c, honest, attacker = run_beside_three_honest(tmp_path, "finished_flood_client.py")
    try:
        finish_in_agreement(c, honest, min_common=5)
        floods = attacker.events("finished_flood: pushed")
        assert floods, c.diagnostics()
        for flood in floods:
            statuses = flood["flood_statuses"]
            # one Finished per sender and step: ours was sent first, so at most one of the
            # flood's per peer (where ours had not arrived yet) is taken
            assert statuses.get("accepted", 0) <= flood["peers"], statuses
            assert statuses.get("rejected", 0) + statuses.get("deferred", 0) > 0, statuses
        assert_nobody_honest_dropped(honest)
    finally:
        c.stop()


def test_a_slow_first_announcer_stalls_nobody(tmp_path: Path) -> None:
    c, honest, attacker = run_beside_three_honest(tmp_path, "slow_first_announcer_client.py")
    try:
        common = finish_in_agreement(c, honest, min_common=4)
        assert attacker.events("slow_first_announcer: serving"), c.diagnostics()
        counts = [{e["step"]: e["results"] for e in p.events("applied step")} for p in honest]
        for step in common:  # every honest trainer's result applied all along
            assert all(count[step] >= 3 for count in counts), (step, counts)
        assert_nobody_honest_dropped(honest)
    finally:
        c.stop()

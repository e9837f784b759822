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

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness.attack_run import DROPPED_LINE
from bench.harness.client_run import Cluster, Proc, finish_in_agreement, write_state

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def beside_three_honest(tmp_path: Path, program: str, min_common: int) -> Iterator[Attacked]:
    """Run `program` beside three honest clients until they finish in agreement (at least
    `min_common` common applied steps); after the caller's checks, none of them was dropped."""
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
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        attacker = c.start_client(dummy_delay=0.3, program=[sys.executable, str(HERE / program)])
        common = finish_in_agreement(c, honest, min_common=min_common)
        yield Attacked(c, honest, attacker, common)
        for proc in honest:
            assert not proc.events(DROPPED_LINE), f"{proc.name} was dropped"
    finally:
        c.stop()


@dataclass
class Attacked:
    cluster: Cluster
    honest: list[Proc]
    attacker: Proc
    common: list[int]


def test_frame_bombs_are_refused_at_once_and_their_links_closed(tmp_path: Path) -> None:
    with beside_three_honest(tmp_path, "frame_bomb_client.py", 5) as run:
        bombs = run.attacker.events("frame_bomb: sent")
        assert bombs, run.cluster.diagnostics()
        assert sum(b["closed"] for b in bombs) >= 3, bombs  # at least one round of three
        assert all(b["open"] == 0 for b in bombs), bombs
        assert max(b["slowest_close_s"] for b in bombs) < 1.0, bombs


def test_a_finished_flood_is_refused_and_forwarded_by_nobody(tmp_path: Path) -> None:
    with beside_three_honest(tmp_path, "finished_flood_client.py", 5) as run:
        floods = run.attacker.events("finished_flood: pushed")
        assert floods, run.cluster.diagnostics()
        for flood in floods:
            statuses = flood["flood_statuses"]
            # one Finished per sender and step: ours was sent first, so at most one of the
            # flood's per peer (where ours had not arrived yet) is taken
            assert statuses.get("accepted", 0) <= flood["peers"], statuses
            assert statuses.get("rejected", 0) + statuses.get("deferred", 0) > 0, statuses


def test_a_slow_first_announcer_stalls_nobody(tmp_path: Path) -> None:
    with beside_three_honest(tmp_path, "slow_first_announcer_client.py", 4) as run:
        assert run.attacker.events("slow_first_announcer: serving"), run.cluster.diagnostics()
        counts = [{e["step"]: e["results"] for e in p.events("applied step")} for p in run.honest]
        for step in run.common:  # every honest trainer's result applied all along
            assert all(count[step] >= 3 for count in counts), (step, counts)

"""Connection floods (real processes): a host holding hundreds of idle sockets against the
server and against one client's P2P port does not stop the run, split the honest clients or
keep the flooded client's results from anyone.

The flood comes from 127.0.0.2, the honest processes use 127.0.0.1, as distinct hosts would on
the internet; the per-address caps (`--max-connections-per-ip`, `--p2p-max-inbound-per-ip`)
and the pre-join and handshake timeouts are what keep the honest slots free.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, finish_in_agreement, write_state
from bench.harness.flood import Flood

pytestmark = pytest.mark.timeout(300)


def test_floods_at_the_server_and_at_a_peer_change_nothing(tmp_path: Path) -> None:
    c = Cluster(tmp_path, write_state(tmp_path / "state.toml", total_steps=12, witness_nodes=2))
    floods: list[Flood] = []
    try:
        c.start_server("--pre-join-timeout", "2")
        floods.append(Flood(c.port, count=300).start())
        clients = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        floods.append(Flood(clients[0].p2p_port(), count=300).start())
        finish_in_agreement(c, clients, min_common=8)
        for proc in clients:  # the flooded client's results reached everyone
            applied = proc.events("applied step")
            assert applied and all(event["results"] == 3 for event in applied[1:]), applied
        for flood in floods:  # the targets shed the flood: caps at accept, timeouts
            assert flood.opened > 0 and flood.closed_by_target > 0, vars(flood)
    finally:
        for flood in floods:
            flood.stop()
        c.stop()

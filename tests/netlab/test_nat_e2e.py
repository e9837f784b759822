"""A run with a client behind NAT (real server and client processes in the network lab).

The server and two clients are public hosts; the third client is behind its own NAT router
that allows outbound connections only, like a home connection. Nobody can connect to it, so
its results reach its peers only over the connections it opened itself: no client may be
dropped, every client must apply every client's results (the NATted one's included), and the
weights hashes must be identical at every step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.client_run import Proc, applied_hashes, wait_for, write_state

from .cluster import LabCluster
from .lab import Lab

pytestmark = pytest.mark.timeout(300)


def test_a_natted_client_trains_with_public_ones(netlab: Lab, tmp_path: Path) -> None:
    netlab.add_host("srv")
    for name in ("pub1", "pub2"):
        netlab.add_host(name)
    natted = netlab.add_natted_host("nat")
    state = write_state(tmp_path / "state.toml", total_steps=10, witness_nodes=2)
    c = LabCluster(netlab, tmp_path, state)
    c.start_server("srv")
    clients = [c.start_client(name) for name in ("pub1", "pub2", "nat")]
    wait_for(
        lambda: all(p.popen.poll() is not None for p in clients),
        240,
        "the run to finish",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in clients] == [0, 0, 0], c.diagnostics()
    assert c.server is not None
    server_lines = [line.get("msg", "") for line in c.server.lines()]
    assert not [m for m in server_lines if m.startswith("health check from")], c.diagnostics()
    for proc in clients:
        assert not [line for line in proc.lines() if "health check" in str(line.get("msg", ""))], (
            proc.name,
            c.diagnostics(),
        )
        applied = proc.events("applied step")
        assert len(applied) >= 6, (proc.name, c.diagnostics())  # steps 3..9 of 10
        # one result per client at every step: the NATted client's results reached everyone
        assert all(event["results"] == 3 for event in applied[1:]), (proc.name, applied)
    # reachability is known, not assumed: the server connected back to each client
    pub1, pub2, nat = clients
    for proc in (pub1, pub2):
        assert [m for m in messages(proc) if m.startswith("reachable by peers at")], proc.name
        # nobody dialed the natted client's (private, unroutable) address
        assert not [m for m in messages(proc) if natted.address in m], proc.name
    (verdict,) = [m for m in messages(nat) if m.startswith("NOT reachable by peers at")]
    assert f"the server sees us from {natted.public_address}" in verdict, verdict
    tables = [applied_hashes(p) for p in clients]
    assert set(tables[0]) == set(tables[1]) == set(tables[2]), tables
    for step in tables[0]:
        assert tables[0][step] == tables[1][step] == tables[2][step], f"step {step}: {tables}"


def messages(proc: Proc) -> list[str]:
    return [str(line.get("msg", "")) for line in proc.lines()]

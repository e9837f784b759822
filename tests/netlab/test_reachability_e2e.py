"""The server checks each client's advertised P2P address (real processes in the lab).

Two clients behind their own NAT routers: one has a port forward and says so with
`--advertise-addr ROUTER_IP:PORT`, the other has none. The server connects back to each: the
first is reachable (peers will dial it at the forwarded address), the second is not and turns
outbound-only; each is told the address the server sees it from.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.client_run import Proc, wait_for, write_state
from bench.harness.netlab.cluster import P2P_PORT, LabCluster
from bench.harness.netlab.lab import Lab

pytestmark = pytest.mark.timeout(120)


def messages(proc: Proc) -> list[str]:
    return [str(line.get("msg", "")) for line in proc.lines()]


def test_a_port_forward_with_advertise_addr_is_reachable(netlab: Lab, tmp_path: Path) -> None:
    netlab.add_host("srv")
    forwarded = netlab.add_natted_host("fwd")
    closed = netlab.add_natted_host("closed")
    outside = netlab.forward_port("fwd", P2P_PORT)
    state = write_state(tmp_path / "state.toml", init_min_clients=3)  # never starts: not needed
    c = LabCluster(netlab, tmp_path, state)
    c.start_server("srv")
    fwd = c.start_client("fwd", "--advertise-addr", outside)
    shut = c.start_client("closed")

    def verdicts() -> bool:
        return all(any("reachable by peers at" in m for m in messages(p)) for p in (fwd, shut))

    wait_for(verdicts, 60, "both clients' reachability verdicts", c.diagnostics)
    assert (
        f"reachable by peers at {outside} (the server sees us from {forwarded.public_address})"
        in messages(fwd)
    ), c.diagnostics()
    (verdict,) = [m for m in messages(shut) if "reachable by peers at" in m]
    assert verdict.startswith(f"NOT reachable by peers at {closed.address}:{P2P_PORT}"), verdict
    assert f"the server sees us from {closed.public_address}" in verdict, verdict
    assert c.server is not None
    server = messages(c.server)
    assert [m for m in server if m.startswith("p2p address of") and ": reachable" in m]
    assert [m for m in server if m.startswith("p2p address of") and "NOT reachable" in m]

"""Runs with clients behind NAT (real server and client processes in the network lab).

The server and two clients are public hosts; the other clients are each behind their own NAT
router that allows outbound connections only, like a home connection. Nobody can connect to
them, so their results reach their peers only over the connections they opened themselves:
no client may be dropped, every client must apply every client's results (the NATted ones'
included), and the weights hashes must be identical at every step.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.client_run import Proc, applied_hashes, wait_for, write_state

from .cluster import LabCluster
from .lab import Lab

pytestmark = pytest.mark.timeout(300)


def test_a_natted_client_trains_with_public_ones(netlab: Lab, tmp_path: Path) -> None:
    state = write_state(tmp_path / "state.toml", total_steps=10, witness_nodes=2)
    run_and_check(netlab, tmp_path, state, public=2, natted=1, epochs=1)


def test_two_natted_clients_train_with_two_public_ones_over_two_epochs(
    netlab: Lab, tmp_path: Path
) -> None:
    """The NATted clients cannot connect to each other: their results reach each other
    through the public clients (gossip forwards the announcements, and the public clients
    serve the blobs they fetched)."""
    state = write_state(
        tmp_path / "state.toml",
        total_steps=22,
        epoch_time=16,
        warmup_time=10,
        max_round_train_time=3,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=2,
        batch=8,
    )
    run_and_check(netlab, tmp_path, state, public=2, natted=2, epochs=2)


def run_and_check(
    netlab: Lab,
    tmp_path: Path,
    state: Path,
    *,
    public: int,
    natted: int,
    epochs: int,
    cut: tuple[str, str] | None = None,
) -> LabCluster:
    """Run to the end, then: nobody dropped, every client's results applied by everyone at
    every step (but the first of each epoch), identical weights hashes, reachability known."""
    netlab.add_host("srv")
    public_names = [f"pub{i + 1}" for i in range(public)]
    natted_names = [f"nat{i + 1}" for i in range(natted)]
    for name in public_names:
        netlab.add_host(name)
    hidden = [netlab.add_natted_host(name) for name in natted_names]
    if cut is not None:
        netlab.cut(*cut)
    c = LabCluster(netlab, tmp_path, state)
    c.start_server("srv")
    clients = [c.start_client(name) for name in [*public_names, *natted_names]]
    wait_for(
        lambda: all(p.popen.poll() is not None for p in clients),
        240,
        "the run to finish",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in clients] == [0] * len(clients), c.diagnostics()
    assert c.server is not None
    assert not [m for m in messages(c.server) if m.startswith("health check from")]
    everyone = len(clients)
    for proc in clients:
        assert not [m for m in messages(proc) if "health check" in m], (proc.name, c.diagnostics())
        applied = proc.events("applied step")
        assert len(applied) >= 6, (proc.name, c.diagnostics())
        # one result per client at every step: the NATted clients' results reached everyone
        partial = [e["step"] for e in applied if e["results"] != everyone]
        assert len(partial) <= epochs, (proc.name, [(e["step"], e["results"]) for e in applied])
        per_epoch = Counter(e["epoch"] for e in applied)
        assert len(per_epoch) == epochs and min(per_epoch.values()) >= 3, (proc.name, per_epoch)
    # reachability is known, not assumed: the server connected back to each client
    for proc in clients[:public]:
        assert [m for m in messages(proc) if m.startswith("reachable by peers at")], proc.name
        # nobody dialed a natted client's (private, unroutable) address
        assert not [m for h in hidden for m in messages(proc) if h.address in m], proc.name
    for proc, host in zip(clients[public:], hidden, strict=True):
        (verdict,) = [m for m in messages(proc) if m.startswith("NOT reachable by peers at")]
        assert f"the server sees us from {host.public_address}" in verdict, verdict
    tables = [applied_hashes(p) for p in clients]
    steps = set(tables[0])
    assert all(set(table) == steps for table in tables), tables
    for step in steps:
        assert len({table[step] for table in tables}) == 1, f"step {step}: {tables}"
    return c


def messages(proc: Proc) -> list[str]:
    return [str(line.get("msg", "")) for line in proc.lines()]


def test_four_natted_clients_train_through_the_relay(netlab: Lab, tmp_path: Path) -> None:
    """Nobody can connect to anybody: every result crosses the server's relay, in pipes the
    clients open to each other through it, and the run trains as if they were public."""
    state = write_state(
        tmp_path / "state.toml",
        total_steps=12,
        warmup_time=15,
        init_min_clients=4,
        min_clients=3,
        witness_nodes=2,
        batch=8,
    )
    c = run_and_check(netlab, tmp_path, state, public=0, natted=4, epochs=1)
    assert c.server is not None
    pipes = [m for m in messages(c.server) if m.startswith("relay: pipe") and m.endswith("open")]
    assert len(pipes) >= 6, "every pair of the 4 clients has a pipe"  # 4·3/2


def test_two_public_clients_that_cannot_reach_each_other(netlab: Lab, tmp_path: Path) -> None:
    """pub1 and pub2 drop every packet between them (a firewall, a broken route), though the
    server reaches both: their direct dials fail, and what they exchange takes the relay."""
    state = write_state(
        tmp_path / "state.toml",
        total_steps=10,
        warmup_time=15,
        init_min_clients=3,
        min_clients=3,
        witness_nodes=2,
    )
    c = run_and_check(netlab, tmp_path, state, public=3, natted=0, epochs=1, cut=("pub1", "pub2"))
    fallbacks = [m for p in c.clients[:2] for m in messages(p) if "through the relay" in m]
    assert fallbacks, c.diagnostics()

"""Runs with clients behind NAT (real server and client processes in the network lab).

The server and two clients are public hosts; the other clients are each behind their own NAT
router that allows outbound connections only, like a home connection. Nobody can connect to
them, so their results reach their peers only over the connections they opened themselves:
no client may be dropped, every client must apply every client's results (the NATted ones'
included), and the weights hashes must be identical at every step.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from psyche_common.config.loading import load_state
from psyche_common.coordinator import Coordinator, RunState

from bench.harness.client_run import Proc, applied_hashes, wait_for, write_state
from bench.harness.netlab.cluster import LabCluster
from bench.harness.netlab.lab import Lab
from bench.study.coordinator_sim import SimulatedRun, client_id

pytestmark = pytest.mark.timeout(300)

TWO_EPOCHS = {
    "total_steps": 28,
    "epoch_time": 20,
    "warmup_time": 10,
    "max_round_train_time": 3,
    "init_min_clients": 4,
    "min_clients": 3,
    "witness_nodes": 2,
    "batch": 8,
}
"""The two-epoch run's settings. Epoch 0 ends by time, epoch 1 by `total_steps`. The clients
apply round h-2 at round h, so an epoch of n rounds applies n-2 steps (the two rounds after
an epoch times out only apply; the last two rounds before the `total_steps` Cooldown are never
applied, as in the reference). A round lasts at least `round_witness_time` (1 s), and quiet
machines come close (1.03-1.1 s in the lab): a 20 s epoch 0 then holds up to 21 rounds, its
Cooldown comes at step 22 at the latest, and `total_steps` = `epoch_time` + 8 leaves epoch 1
at least 6 rounds (4 applied). With `epoch_time` + 6 (16 and 22) a quiet machine left it 4
rounds (2 applied). Rounds up to ~1.5 s still end epoch 1 by `total_steps`, not by time
(which would start a third epoch). `test_the_two_epoch_settings_fit_two_epochs_at_any_round_speed` checks both on
the real coordinator."""


def test_a_natted_client_trains_with_public_ones(netlab: Lab, tmp_path: Path) -> None:
    state = write_state(tmp_path / "state.toml", total_steps=10, witness_nodes=2)
    run_and_check(netlab, tmp_path, state, public=2, natted=1, epochs=1)


def test_two_natted_clients_train_with_two_public_ones_over_two_epochs(
    netlab: Lab, tmp_path: Path
) -> None:
    """The NATted clients cannot connect to each other: their results reach each other
    through the public clients (gossip forwards the announcements, and the public clients
    serve the blobs they fetched)."""
    state = write_state(tmp_path / "state.toml", **TWO_EPOCHS)
    run_and_check(netlab, tmp_path, state, public=2, natted=2, epochs=2)


class PacedRun(SimulatedRun):
    """A simulated run whose clients finish loading `warmup_s` after each Warmup starts and
    send their round witnesses `train_s` after each RoundTrain starts (a round then lasts
    `train_s` + `round_witness_time`)."""

    def __init__(self, coord: Coordinator, *, start: float, warmup_s: float, train_s: float):
        super().__init__(coord, random.Random(7))
        self.now = start
        self.warmup_s, self.train_s = warmup_s, train_s

    def clients_act(self) -> None:
        elapsed = self.now - self.coord.run_state_start_ms / 1000
        if self.coord.run_state == RunState.Warmup and elapsed < self.warmup_s:
            return
        if self.coord.run_state == RunState.RoundTrain and elapsed < self.train_s:
            return
        super().clients_act()

    def applied_per_epoch(self) -> list[int]:
        """Steps applied in each epoch: n rounds apply n - 2 (round h applies round h-2)."""
        rounds = Counter(epoch_start for epoch_start, _height in self.rounds)
        return [n - 2 for _, n in sorted(rounds.items())]


@pytest.mark.parametrize(
    ("round_s", "warmup_s", "start_fraction"),
    [
        (1.0, 0.0, 0.0),  # the floor: instant Warmup, rounds of round_witness_time only
        (1.0, 0.5, 0.99),  # the epoch's start second truncated: up to 1 s shorter
        (1.05, 0.6, 0.0),  # a quiet machine (the lab's runs: 1.03-1.1 s rounds)
        (1.4, 2.5, 0.0),  # a loaded machine with slow Warmups: epoch 1 must not time out
        (1.4, 2.5, 0.99),
    ],
)
def test_the_two_epoch_settings_fit_two_epochs_at_any_round_speed(
    tmp_path: Path, round_s: float, warmup_s: float, start_fraction: float
) -> None:
    """`TWO_EPOCHS` on the real coordinator with the lab run's four clients, paced: exactly
    two epochs, each applying at least 3 steps, from the fastest rounds the coordinator allows
    to those of a loaded machine."""
    state = load_state(write_state(tmp_path / "state.toml", **TWO_EPOCHS))
    run = PacedRun(
        Coordinator.from_state_file(state),
        start=1_000_000 + start_fraction,
        warmup_s=warmup_s,
        train_s=round_s - state.config.round_witness_time,
    )
    for name in ("pub1", "pub2", "nat1", "nat2"):
        run.join(client_id(name))
    assert run.run_until(lambda: run.coord.run_state == RunState.Finished, 2000, dt=0.05)
    applied = run.applied_per_epoch()
    assert len(applied) == 2 and min(applied) >= 3, applied


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
        assert len(per_epoch) == epochs and min(per_epoch.values()) >= 3, (
            proc.name,
            per_epoch,
            epoch_timeline(c.server),
        )
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


def epoch_timeline(server: Proc) -> list[str]:
    """The server's run state changes with their times, rounds folded into one line each
    stretch: where each epoch's steps went (Warmup start, rounds and their pace, Cooldown)."""
    out: list[str] = []
    rounds: list[str] = []
    for line in server.lines():
        message = str(line.get("msg", ""))
        if message.startswith("run state RoundWitness -> RoundTrain"):
            rounds.append(str(line.get("ts", "")))
            continue
        if not message.startswith("run state"):
            continue
        if rounds:
            out.append(f"{len(rounds)} rounds {rounds[0]} .. {rounds[-1]}")
            rounds = []
        out.append(f"{line.get('ts', '')} {message}")
    return out


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

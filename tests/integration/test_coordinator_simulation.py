"""Whole runs of the pure coordinator with simulated clients on a fake clock.

WaitingForMembers → Warmup → rounds → Cooldown → … → Finished, with late joins, a client that
disconnects, one that goes silent (its peers' health checks drop it) and a pause/resume. The
clients decode the server's broadcast (`to_wire` → msgpack → `from_wire`) like real ones.
"""

from __future__ import annotations

import itertools
import random

import msgpack
from psyche_common.config import HubCheckpoint, P2PCheckpoint
from psyche_common.coordinator import ClientState, Coordinator, RunState, TickResult

from bench.study.coordinator_sim import SimulatedRun, client_id
from tests.support.coordinators import make_coordinator


class WireSimulatedRun(SimulatedRun):
    def view(self) -> Coordinator:
        return Coordinator.from_wire(msgpack.unpackb(msgpack.packb(self.coord.to_wire())))


def new_run(**config) -> WireSimulatedRun:
    settings = dict(
        warmup_time=10, cooldown_time=3, max_round_train_time=5, round_witness_time=2,
        epoch_time=40, total_steps=30, init_min_clients=3, min_clients=2, witness_nodes=2,
        global_batch_size_start=4, global_batch_size_end=12,
        global_batch_size_warmup_tokens=20 * 64, waiting_for_members_extra_time=2,
    )  # fmt: skip
    settings.update(config)
    coord = make_coordinator(model={"max_seq_len": 64}, **settings)
    return WireSimulatedRun(coord, random.Random(1234))


def epoch_ends(run: SimulatedRun) -> list[TickResult]:
    return [r for r in run.results if r.epoch_ended]


def test_honest_run_finishes() -> None:
    run = new_run()
    for name in ("a", "b", "c"):
        run.join(client_id(name))
    assert run.run_until(lambda: run.coord.run_state == RunState.Finished, 2000)
    coord = run.coord
    assert coord.progress.step == coord.config.total_steps
    assert coord.progress.epoch >= 2
    assert all(r.success for r in epoch_ends(run))
    assert run.dropped_by_health_check == []
    # The data cursor never skipped or reused a sample within training rounds.
    trained = sorted(
        (b.start, b.end) for r in run.rounds.values() if r.training for b in r.assignment
    )
    for (_, end), (start, _) in itertools.pairwise(trained):
        assert start > end


def test_run_with_drops_late_joins_and_pause_finishes() -> None:
    run = new_run(total_steps=40)
    a, b, c, d, e, f = (client_id(n) for n in "abcdef")
    for cid in (a, b, c, e):
        run.join(cid)
    members = lambda: {m.id for m in run.coord.epoch_state.clients}  # noqa: E731

    # Epoch 0 trains for a while; a late joiner waits in pending until the next epoch.
    assert run.run_until(lambda: run.coord.current_round().height >= 2, 500)
    run.join(d)
    assert d not in members()
    first_epoch = run.coord.progress.epoch
    assert run.run_until(lambda: d in members() and run.coord.active(), 500)
    assert run.coord.progress.epoch > first_epoch

    # c goes silent (still connected): witnesses stop seeing its results and accuse it; once it
    # has exited as Dropped the server kicks it from the pending set.
    run.go_silent(c)
    assert run.run_until(lambda: c in run.dropped_by_health_check, 1000)
    dropped = run.coord.epoch_state.clients[run.coord.client_index(c)]
    assert dropped.state == ClientState.Dropped
    assert run.run_until(lambda: c not in run.pending, 100)
    assert any(
        x.id == c and x.state == ClientState.Dropped for x in run.coord.epoch_state.exited_clients
    )

    # b disconnects during a round: withdrawn, then moved out at the next witness timeout.
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 200)
    run.disconnect(b)
    assert run.run_until(lambda: b not in members(), 100)
    assert any(
        x.id == b and x.state == ClientState.Withdrawn for x in run.coord.epoch_state.exited_clients
    )

    # Pause while active: deferred to the end of the epoch's cooldown.
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 200)
    run.coord.pause(run.now)
    assert run.coord.pending_pause
    assert run.run_until(lambda: run.coord.run_state == RunState.Paused, 500)
    assert run.coord.epoch_state.cold_start_epoch and not run.coord.pending_pause
    paused = (run.coord.progress.step, run.data_cursor())
    for _ in range(20):
        run.step()
    assert (run.coord.progress.step, run.data_cursor()) == paused
    run.coord.resume(run.now)
    run.join(f)

    assert run.run_until(lambda: run.coord.run_state == RunState.Finished, 3000)
    coord = run.coord
    assert coord.progress.step == coord.config.total_steps
    states = [new for _, new, _ in run.transitions]
    assert RunState.Paused in states and states[-1] == RunState.Finished
    assert f in members() | {x.id for x in coord.epoch_state.exited_clients}
    assert c not in members()


def test_everyone_leaving_falls_back_to_hub() -> None:
    run = new_run(total_steps=25)
    first = [client_id(n) for n in ("x1", "x2", "x3")]
    for cid in first:
        run.join(cid)
    assert run.run_until(lambda: run.coord.progress.epoch == 1, 1000)
    assert run.coord.run_state == RunState.WaitingForMembers
    assert isinstance(run.coord.model.checkpoint, P2PCheckpoint)
    for cid in first:
        run.disconnect(cid)
    for name in ("y1", "y2", "y3"):
        run.join(client_id(name))
    assert run.run_until(lambda: run.coord.run_state == RunState.Warmup, 500)
    assert isinstance(run.coord.model.checkpoint, HubCheckpoint)
    assert run.run_until(lambda: run.coord.run_state == RunState.Finished, 2000)


def test_too_few_clients_abandons_warmup_and_recovers() -> None:
    run = new_run(init_min_clients=2, min_clients=2, warmup_time=10, total_steps=6)
    a, b, c = (client_id(n) for n in "abc")
    run.join(a)
    run.join(b)
    assert run.run_until(lambda: run.coord.run_state == RunState.Warmup, 50)
    run.disconnect(b)
    run.go_silent(a)  # nobody sends warmup witnesses
    assert run.run_until(lambda: run.coord.run_state == RunState.WaitingForMembers, 50)
    assert epoch_ends(run)[-1] == TickResult.epoch_end(False)
    assert run.coord.progress.epoch == 0
    run.join(a)
    run.join(c)
    assert run.run_until(lambda: run.coord.run_state == RunState.Finished, 2000)

"""The reference's integration scenarios (spec §8.2, integration_tests.rs), replayed on the pure
coordinator with simulated clients and the reference's timings on a fake clock."""

from __future__ import annotations

import random

from psyche_common.coordinator import RunState

from bench.study.coordinator_sim import SimulatedRun, client_id
from tests.support.coordinators import make_coordinator

TIMINGS = {
    "warmup_time": 20,
    "max_round_train_time": 5,
    "round_witness_time": 2,
    "cooldown_time": 3,
    "epoch_time": 30,
    "total_steps": 100,
    "waiting_for_members_extra_time": 2,
}


def scenario(num_clients: int, **overrides) -> SimulatedRun:
    config = {
        **TIMINGS,
        "min_clients": num_clients,
        "init_min_clients": num_clients,
        "global_batch_size_start": max(num_clients, 2),
        "global_batch_size_end": max(num_clients, 2),
        "witness_nodes": 1,
        **overrides,
    }
    return SimulatedRun(make_coordinator(**config), random.Random(num_clients))


def names(*labels: str) -> list[bytes]:
    return [client_id(label) for label in labels]


def test_connect_multiple_nodes_below_init_min() -> None:
    run = scenario(15)
    for cid in names(*(f"n{i}" for i in range(10))):
        run.join(cid)
    for _ in range(30):
        run.step()
    assert len(run.pending) == 10
    assert run.coord.run_state == RunState.WaitingForMembers


def test_waiting_for_members_to_warmup_to_round_train_to_witness() -> None:
    run = scenario(2, witness_nodes=2)
    run.warmup_probability = 0.0  # nobody finishes loading: Warmup ends by its timeout
    run.witness_probability = 0.0
    run.step()
    assert run.coord.run_state == RunState.WaitingForMembers
    for cid in names("a", "b"):
        run.join(cid)
    run.step()
    assert run.coord.run_state == RunState.Warmup
    assert len(run.coord.epoch_state.clients) == 2
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 25)
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundWitness, 6)


def test_shutdown_node_in_warmup() -> None:
    run = scenario(2)
    run.warmup_probability = 0.0
    a, b = names("a", "b")
    run.join(a)
    run.join(b)
    run.step()
    assert run.coord.run_state == RunState.Warmup
    run.disconnect(b)
    run.step()
    assert run.coord.run_state == RunState.WaitingForMembers
    assert len(run.coord.epoch_state.clients) == 1
    assert len(run.pending) == 1


def test_all_clients_participate_in_witness_bloom() -> None:
    run = scenario(5)
    members = names(*"abcde")
    for cid in members:
        run.join(cid)
    assert run.run_until(lambda: run.coord.epoch_state.rounds_head == 2, 200)
    witnesses = run.coord.epoch_state.rounds[1].witnesses
    assert sum(run.coord.trainer_health_score(cid, witnesses) for cid in members) == 5


def test_replace_node_and_complete_round() -> None:
    run = scenario(2)
    run.warmup_probability = 0.0
    a, b, c = names("a", "b", "c")
    run.join(a)
    run.join(b)
    run.step()
    assert run.coord.run_state == RunState.Warmup
    run.join(c)  # joins during Warmup: pending only
    run.disconnect(b)
    run.step()
    assert run.coord.run_state == RunState.WaitingForMembers
    assert run.run_until(lambda: run.coord.run_state == RunState.Warmup, 5)
    assert {m.id for m in run.coord.epoch_state.clients} == {a, c}
    run.warmup_probability = 1.0
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 25)
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundWitness, 6)


def test_finish_epoch() -> None:
    run = scenario(2)
    for cid in names("a", "b"):
        run.join(cid)
    heads = []
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 25)
    while run.coord.run_state != RunState.Cooldown:
        head = run.coord.epoch_state.rounds_head
        if not heads or heads[-1] != head:
            heads.append(head)
        run.step()
    assert heads[:4] == [0, 1, 2, 3]
    assert run.run_until(lambda: run.coord.progress.epoch == 1, 5)


def test_client_join_in_training() -> None:
    run = scenario(2)
    a, b, c = names("a", "b", "c")
    run.join(a)
    run.join(b)
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 25)
    run.join(c)
    assert len(run.pending) == 3 and len(run.coord.epoch_state.clients) == 2
    assert run.run_until(lambda: run.coord.epoch_state.rounds_head == 2, 30)
    witnesses = run.coord.epoch_state.rounds[1].witnesses
    assert sum(run.coord.trainer_health_score(cid, witnesses) for cid in (a, b)) == 2
    assert run.run_until(lambda: run.coord.progress.epoch == 1, 200)
    assert run.run_until(lambda: run.coord.run_state == RunState.Warmup, 10)
    assert len(run.coord.epoch_state.clients) == 3


def test_shutdown_node_in_training_and_complete_round() -> None:
    run = scenario(3, witness_nodes=2)
    a, b, c, d = names("a", "b", "c", "d")
    for cid in (a, b, c):
        run.join(cid)
    assert run.run_until(lambda: run.coord.run_state == RunState.RoundTrain, 25)
    run.disconnect(c)
    assert run.run_until(lambda: run.coord.run_state == RunState.Cooldown, 10)
    assert run.run_until(lambda: run.coord.run_state == RunState.WaitingForMembers, 5)
    run.join(d)
    assert run.run_until(lambda: run.coord.run_state == RunState.Warmup, 5)
    assert {m.id for m in run.coord.epoch_state.clients} == {a, b, d}

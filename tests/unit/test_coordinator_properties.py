"""Property tests of the coordinator over random configs, client counts, joins/drops and clocks.

- every sample of a round's global batch is assigned to exactly one trainer;
- the state never changes to itself and only along the transition table;
- the step and the data cursor never go backwards;
- a run with enough healthy clients always reaches Finished;
- the wire form decodes to an equal coordinator at any point.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.coordinator.assignment import assign_data_for_round, get_batch_size

from bench.study.coordinator_sim import SimulatedRun, client_id
from tests.support.coordinators import make_coordinator

PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass
class Rnd:
    data_index: int
    random_seed: int
    tie_breaker_tasks: int = 0


@dataclass
class Member:
    id: bytes


@st.composite
def coordinator_configs(draw: st.DrawFn, max_min_clients: int = 5) -> dict:
    """Configs that pass the reference's validation rules (spec §2.1)."""
    epoch_time = draw(st.integers(8, 90))
    min_clients = draw(st.integers(1, max_min_clients))
    start = draw(st.integers(1, 12))
    return {
        "epoch_time": epoch_time,
        "warmup_time": draw(st.integers(1, min(epoch_time - 1, 15))),
        "max_round_train_time": draw(st.integers(1, min(epoch_time - 1, 8))),
        "round_witness_time": draw(
            st.integers(1, 4) | st.integers(1, 4000).map(lambda ms: ms / 1000)
        ),
        "cooldown_time": draw(st.integers(1, 5)),
        "waiting_for_members_extra_time": draw(st.integers(1, 4)),
        "min_clients": min_clients,
        "init_min_clients": draw(st.integers(min_clients, min_clients + 2)),
        "witness_nodes": draw(st.integers(0, min(min_clients, 3))),
        "global_batch_size_start": start,
        "global_batch_size_end": draw(st.integers(start, start + 20)),
        "global_batch_size_warmup_tokens": draw(st.sampled_from([0, 100, 5000])),
        "total_steps": draw(st.integers(2, 14)),
    }


@PROPERTY_SETTINGS
@given(
    num_clients=st.integers(1, 300),
    batch_start=st.integers(1, 2000),
    batch_extra=st.integers(0, 2000),
    warmup_tokens=st.integers(0, 10**6),
    data_index=st.integers(0, 10**9),
    seed=st.integers(0, 2**64 - 1),
    witness_nodes=st.integers(0, 32),
    seq_len=st.integers(1, 4096),
)
def test_every_sample_is_assigned_to_exactly_one_trainer(
    num_clients: int,
    batch_start: int,
    batch_extra: int,
    warmup_tokens: int,
    data_index: int,
    seed: int,
    witness_nodes: int,
    seq_len: int,
) -> None:
    witness_nodes = min(witness_nodes, num_clients)
    config = make_coordinator(
        min_clients=32,
        init_min_clients=32,
        global_batch_size_start=batch_start,
        global_batch_size_end=batch_start + batch_extra,
        global_batch_size_warmup_tokens=warmup_tokens,
    ).config
    config.witness_nodes = witness_nodes
    members = [Member(client_id(f"m{i}")) for i in range(num_clients)]
    assignment = assign_data_for_round(Rnd(data_index, seed), members, config, seq_len)
    batch_size = get_batch_size(config, data_index * seq_len)
    samples = sorted(i for b in assignment for i in range(b.start, b.end + 1))
    assert samples == list(range(data_index, data_index + batch_size))
    sizes = [len(b) for b in assignment]
    assert max(sizes) - min(sizes) <= 1
    owners = list(assignment.values())
    assert len(set(owners)) == len(owners) == min(num_clients, batch_size)


ACTION_NAMES = ["tick"] * 8 + ["join", "disconnect", "silence", "jump", "pause", "resume"]
ACTIONS = st.lists(
    st.tuples(st.sampled_from(ACTION_NAMES), st.integers(0, 10**6)), min_size=20, max_size=100
)


@PROPERTY_SETTINGS
@given(config=coordinator_configs(), actions=ACTIONS, seed=st.integers(0, 2**32))
def test_random_runs_keep_the_invariants(config: dict, actions: list, seed: int) -> None:
    coord = make_coordinator(**config)
    run = SimulatedRun(coord, random.Random(seed), witness_probability=0.8, warmup_probability=0.3)
    names = [client_id(f"p{i}") for i in range(config["init_min_clients"] + 3)]
    for cid in names[: config["init_min_clients"]]:
        run.join(cid)
    for action, value in actions:
        known = list(run.clients)
        if action == "join":
            run.join(names[value % len(names)])
        elif action == "disconnect" and known:
            run.disconnect(known[value % len(known)])
        elif action == "silence" and known:
            run.go_silent(known[value % len(known)])
        elif action == "pause" and not coord.halted():
            coord.pause(run.now)
        elif action == "resume" and coord.run_state == RunState.Paused:
            coord.resume(run.now)
        elif action == "jump":
            run.step(1 + value % 40)  # a late tick: the clock jumps
        for _ in range(1 + value % 10):
            run.step()
        assert Coordinator.from_wire(coord.to_wire()) == coord


@PROPERTY_SETTINGS
@given(
    config=coordinator_configs(max_min_clients=4),
    extra_clients=st.integers(0, 3),
    late_joiners=st.integers(0, 2),
    seed=st.integers(0, 2**32),
)
def test_enough_healthy_clients_always_finish(
    config: dict, extra_clients: int, late_joiners: int, seed: int
) -> None:
    num_clients = config["init_min_clients"] + extra_clients
    # Every trainer gets a batch (as in the reference's integration tests); otherwise a trainer
    # without data is never seen by witnesses and gets dropped.
    config["global_batch_size_start"] = max(
        config["global_batch_size_start"], num_clients + late_joiners
    )
    config["global_batch_size_end"] = max(
        config["global_batch_size_end"], config["global_batch_size_start"]
    )
    coord = make_coordinator(**config)
    run = SimulatedRun(coord, random.Random(seed))
    for i in range(num_clients):
        run.join(client_id(f"h{i}"))
    run.run_until(lambda: coord.progress.step >= 2, 500)
    for i in range(late_joiners):
        run.join(client_id(f"late{i}"))
    finished = run.run_until(lambda: coord.run_state == RunState.Finished, 5000)
    assert finished, f"stuck in {coord.run_state.name} at step {coord.progress.step}"
    assert coord.progress.step == config["total_steps"]
    assert run.dropped_by_health_check == []

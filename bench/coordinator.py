"""Coordinator cost benchmark; prints exactly one JSON object on stdout.

Measured in this run (median of repeated timings, microseconds):
1. With 256 clients (the reference's per-epoch maximum): one RoundTrain tick, one RoundWitness
   timeout tick that starts the next round, accepting one round witness, a health check, the
   data assignment of a round (`assign_data_for_state`) and `to_wire` + `Coordinator.from_wire`.
   Baseline: a plain `msgpack.packb` of the same state's wire dict (`ratio_vs_msgpack_encode`).
2. With 10,000 simulated clients: the coordinator caps an epoch at 256 clients, so the tick
   cannot be measured there; we time the per-round functions directly on a 10,000-member list —
   committee selection of every member (batched and one index at a time), witness flags and the
   data assignment — and compare them with the same functions at 256 (`ratio_vs_256`).

`--quick` (what `make test` runs): every measurement above, repeated 3 times instead of 30.

Usage: .venv/bin/python bench/coordinator.py [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
from psyche_common.bloom import Bloom
from psyche_common.config import CoordinatorConfig, LLMConfig
from psyche_common.coordinator import Coordinator, RunState, Witness
from psyche_common.coordinator.assignment import assign_data_for_round, assign_data_for_state
from psyche_common.coordinator.committee import CommitteeSelection

CONFIG = {
    "warmup_time": 30,
    "cooldown_time": 30,
    "max_round_train_time": 30,
    "round_witness_time": 5,
    "global_batch_size_warmup_tokens": 0,
    "epoch_time": 3600,
    "total_steps": 1_000_000,
    "init_min_clients": 1,
    "min_clients": 1,
    "witness_nodes": 0,
    "global_batch_size_start": 1024,
    "global_batch_size_end": 1024,
    "verification_percent": 0,
    "waiting_for_members_extra_time": 1,
}
MODEL = {
    "max_seq_len": 2048,
    "cold_start_warmup_steps": 0,
    "architecture": "HfLlama",
    "checkpoint": {"Hub": {"repo_id": "builtin:llama-2m"}},
    "data_type": "Pretraining",
    "data_location": "Dummy",
    "lr_schedule": {"Constant": {"base_lr": 1e-3, "warmup_init_lr": 0.0, "warmup_steps": 1}},
    "optimizer": "Dummy",
}


@dataclass
class Member:
    id: bytes


@dataclass
class BareRound:
    data_index: int
    random_seed: int
    tie_breaker_tasks: int = 0


def member_ids(n: int) -> list[bytes]:
    return [hashlib.sha256(f"member-{i}".encode()).digest() for i in range(n)]


def median_us(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def full_witness(coord: Coordinator, index: int, ids: list[bytes], rng: random.Random) -> Witness:
    proof = CommitteeSelection.from_coordinator(coord, 0).get_witness(index)
    participant = Bloom.random(rng)
    participant.add_all(hashlib.sha256(i).digest() for i in ids)
    return Witness(proof, participant, Bloom.random(rng), bytes(32))


def coordinator_in_round(ids: list[bytes], rng: random.Random) -> tuple[Coordinator, int]:
    """A coordinator at height 2 of an epoch with `ids`, every round fully witnessed."""
    coord = Coordinator(
        run_id="bench",
        run_state=RunState.WaitingForMembers,
        model=LLMConfig.model_validate(MODEL),
        config=CoordinatorConfig.model_validate(CONFIG),
    )
    now = 1_000
    coord.tick(ids, now, 0)
    now += CONFIG["warmup_time"]
    coord.tick(ids, now, rng.getrandbits(64))
    for _ in range(2):
        selection = CommitteeSelection.from_coordinator(coord, 0)
        for index in range(len(ids)):
            if selection.get_witness(index).witness:
                coord.witness(ids[index], full_witness(coord, index, ids, rng), now)
        now += CONFIG["round_witness_time"]
        coord.tick(ids, now, rng.getrandbits(64))
    assert coord.run_state == RunState.RoundTrain and coord.current_round().height == 2
    return coord, now


def measure_256(repeat: int) -> dict[str, float]:
    rng = random.Random(0)
    ids = member_ids(256)
    coord, now = coordinator_in_round(ids, rng)
    wire = coord.to_wire()
    figures = {
        "msgpack_encode_state_us": median_us(lambda: msgpack.packb(wire), repeat),
        "wire_bytes": len(msgpack.packb(wire)),
        "tick_round_train_us": median_us(lambda: coord.tick(ids, now + 1, 1), repeat),
        "assign_data_for_state_us": median_us(lambda: assign_data_for_state(coord), repeat),
        "to_wire_us": median_us(coord.to_wire, repeat),
        "from_wire_us": median_us(lambda: Coordinator.from_wire(wire), repeat),
    }
    selection = CommitteeSelection.from_coordinator(coord, 0)
    witness_index = next(i for i in range(256) if selection.get_witness(i).witness)
    witness = full_witness(coord, witness_index, ids, rng)

    def accept_witness() -> None:
        coord.current_round().witnesses.clear()
        coord.witness(ids[witness_index], witness, now + 1)

    figures["accept_round_witness_us"] = median_us(accept_witness, repeat)
    coord.current_round().witnesses.clear()

    def witness_timeout_tick() -> None:
        # Restore RoundWitness with a fixed witness set, then time the tick that starts a round.
        snapshot = coord.copy()
        snapshot.run_state = RunState.RoundWitness
        snapshot.run_state_start_unix_timestamp = now
        snapshot.current_round().witnesses = [witness]
        start = time.perf_counter()
        snapshot.tick(ids, now + CONFIG["round_witness_time"], 3)
        elapsed.append((time.perf_counter() - start) * 1e6)

    elapsed: list[float] = []
    for _ in range(max(3, repeat // 10)):
        witness_timeout_tick()
    figures["tick_round_witness_timeout_us"] = statistics.median(elapsed)

    # Health check: accuse one trainer nobody saw (the witnesses saw everyone, so fake one);
    # only a witness of the previous round may accuse.
    previous = coord.previous_round()
    previous_selection = CommitteeSelection.from_coordinator(coord, -1)
    accuser = next(ids[i] for i in range(len(ids)) if previous_selection.get_witness(i).witness)
    index = 0 if ids[0] != accuser else 1
    unseen = ids[index]
    empty = Bloom.random(rng)
    for w in previous.witnesses:
        w.participant_bloom = empty
    proof = previous_selection.get_committee(index)
    healthy = coord.epoch_state.clients[index].state

    def health_check() -> None:
        coord.epoch_state.clients[index].state = healthy
        coord.health_check(accuser, [(unseen, proof)])

    figures["health_check_us"] = median_us(health_check, repeat)
    return figures


def measure_members(n: int, repeat: int) -> dict[str, float]:
    members = [Member(i) for i in member_ids(n)]
    config = CoordinatorConfig.model_validate(CONFIG)
    round_ = BareRound(data_index=123_456, random_seed=987_654_321)
    selection = CommitteeSelection.new(0, 0, 0, n, round_.random_seed)
    single = min(n, 256)
    return {
        "assign_data_us": median_us(
            lambda: assign_data_for_round(round_, members, config, 2048), repeat
        ),
        "all_committees_batched_us": median_us(selection.all_committees, repeat),
        "all_witness_flags_batched_us": median_us(selection.all_witness_flags, repeat),
        "committee_one_by_one_per_member_us": median_us(
            lambda: [selection.get_committee(i) for i in range(single)], max(1, repeat // 5)
        )
        / single,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=None, help="timings per figure (30)")
    parser.add_argument("--quick", action="store_true", help="3 timings per figure (seconds)")
    args = parser.parse_args()
    repeat = args.repeat or (3 if args.quick else 30)
    at_256 = measure_256(repeat)
    members_256 = measure_members(256, repeat)
    members_10k = measure_members(10_000, max(3, repeat // 10))
    baseline = at_256["msgpack_encode_state_us"]
    result = {
        "benchmark": "coordinator",
        "quick": args.quick,
        "repeat": repeat,
        "clients_256": at_256,
        "ratio_vs_msgpack_encode": {
            key: round(value / baseline, 2)
            for key, value in at_256.items()
            if key.endswith("_us") and key != "msgpack_encode_state_us"
        },
        "members_256": members_256,
        "members_10000": members_10k,
        "members_10000_note": (
            "the coordinator admits at most 256 clients per epoch; for 10,000 the per-round "
            "selection and assignment functions are timed directly on a 10,000-member list"
        ),
        "ratio_10000_vs_256": {
            key: round(members_10k[key] / members_256[key], 2) for key in members_256
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Per-client batch shares (`coordinator.shares`): integer shares that sum to the batch within
their bounds, witnessed times agreed by quorum, rates that converge to the trainers' speeds,
a liar that gains nothing, the option off (equal shares, nothing stored) and the wire and
saved-state forms with shares."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, CoordinatorError, RunState
from psyche_common.coordinator.assignment import assign_data_for_state, split_batch
from psyche_common.coordinator.committee import CommitteeSelection
from psyche_common.coordinator.shares import (
    RATE_SCALE,
    TIME_TOLERANCE_MS,
    agreed_time,
    share_sizes,
)
from psyche_common.coordinator.wire import epoch_state_from_toml, epoch_state_to_toml

from tests.support.coordinators import (
    ids,
    make_coordinator,
    round_witness_for,
    round_witnesses,
    to_round_train,
)

SPEEDS = [1, 1, 2, 4]
"""Samples per 100 ms of four trainers."""
OVERHEAD_MS = 50


def _unseeded(wire: dict[str, Any]) -> dict[str, Any]:
    """`wire` without the rounds' verifier-sample seeds, which a state file never keeps
    (only their commitments)."""
    epoch = wire.get("epoch_state", wire)
    for round_ in epoch["rounds"]:
        round_.pop("sample_seed", None)
    return wire


def test_shares_are_proportional_integers_that_sum_to_the_batch() -> None:
    assert share_sizes([1, 1, 2, 4], 64, 4) == [8, 8, 16, 32]
    assert share_sizes([3, 3, 3], 10, 4) == [4, 3, 3]  # the remainder to the earlier trainer
    assert share_sizes([0, 2, 6], 12, 4) == [4, 2, 6]  # unmeasured: the mean rate (4)
    assert share_sizes([0, 0], 8, 4) == []  # nothing measured: the equal split
    assert share_sizes([5, 1], 1, 4) == []  # more trainers than samples
    assert share_sizes([1000, 1, 1, 1], 40, 2) == [20, 7, 7, 6]  # capped at 2 x the mean (10)
    assert share_sizes([10**9, 1, 1, 1], 40, 4) == [37, 1, 1, 1]  # never below one sample


def test_shares_keep_their_bounds_for_any_rates() -> None:
    rng = random.Random(30)
    for _ in range(500):
        n = rng.randint(1, 40)
        batch = rng.randint(n, 2000)
        multiple = rng.randint(1, 8)
        rates = [rng.choice([0, rng.randint(1, 10**12)]) for _ in range(n)]
        sizes = share_sizes(rates, batch, multiple)
        if not any(rates):
            assert sizes == []
            continue
        cap = max(-(-batch // n), multiple * batch // n)
        assert sum(sizes) == batch and len(sizes) == n
        assert min(sizes) >= 1 and max(sizes) <= cap, (rates, batch, multiple, sizes)


def test_witnessed_times_count_only_when_a_quorum_agrees() -> None:
    assert agreed_time([900, 1000, 1100], 2) == 1000
    assert agreed_time([1000, 0, 0], 2) is None  # one report is no quorum
    assert agreed_time([1, 1000, 1010, 1020], 3) == 1000  # one liar moves no median
    far = 1000 + TIME_TOLERANCE_MS + 1
    assert agreed_time([1000, far, 2 * far], 2) is None  # nothing agrees


def _coordinator(**config: object) -> tuple[Coordinator, int]:
    coord = make_coordinator(
        witness_nodes=0,
        min_clients=4,
        init_min_clients=4,
        global_batch_size_start=64,
        global_batch_size_end=64,
        max_round_train_time=60,
        epoch_time=100_000,
        **config,
    )
    return coord, to_round_train(coord, ids(4))


def _run(
    coord: Coordinator,
    now: int,
    rounds: int,
    lie: dict[bytes, int] | None = None,
    delay: dict[bytes, int] | None = None,
    unseen: dict[int, bytes] | None = None,
) -> list[dict[bytes, int]]:
    """`rounds` rounds where trainer i needs `OVERHEAD_MS + size * 100 / SPEEDS[i]` ms (plus
    its `delay`) and every witness reports those times of the round before (`lie`: a witness
    reporting this time for its own batch; `unseen`: round → a trainer whose result of the
    round before no witness saw); the samples of each trainer per round."""
    speed = dict(zip(ids(4), SPEEDS, strict=True))
    history: list[dict[bytes, int]] = []
    previous: dict[BatchId, bytes] = {}
    for number in range(rounds):
        missing = (unseen or {}).get(number)
        seen = [i for i in ids(4) if i != missing]
        assignment = assign_data_for_state(coord)
        history.append({owner: len(batch) for batch, owner in assignment.items()})
        true_ms = [
            OVERHEAD_MS + len(batch) * 100 // speed[owner] + (delay or {}).get(owner, 0)
            for batch, owner in sorted(previous.items())
        ]
        for witness_id in round_witnesses(coord):
            witness = round_witness_for(coord, witness_id, seen)
            times = list(true_ms)
            for k, (_, owner) in enumerate(sorted(previous.items())):
                if lie and owner == witness_id and witness_id in lie:
                    times[k] = lie[witness_id]
                if owner == missing:
                    times[k] = 0
            coord.witness(witness_id, dataclasses.replace(witness, result_ms=times), now)
        assert coord.run_state == RunState.RoundWitness
        now += 3
        coord.tick(ids(4), now, now)
        assert coord.run_state == RunState.RoundTrain
        previous = assignment
    return history


def test_shares_converge_to_the_trainers_speeds() -> None:
    coord, now = _coordinator(per_client_shares=True)
    history = _run(coord, now, 12)
    assert set(history[0].values()) == {16}  # a new member's share: equal
    speeds = dict(zip(ids(4), SPEEDS, strict=True))
    last = history[-1]
    assert sum(last.values()) == 64
    for client_id, samples in last.items():
        assert abs(samples - 8 * speeds[client_id]) <= 2, (samples, speeds[client_id])
    rate = {c.id: c.rate for c in coord.epoch_state.clients}
    assert rate[ids(4)[3]] > 3 * rate[ids(4)[0]] > 0
    assert coord.current_round().shares and sum(coord.current_round().shares) == 64


def test_a_trainer_that_lies_about_its_speed_gains_no_share() -> None:
    honest, now = _coordinator(per_client_shares=True)
    baseline = _run(honest, now, 12)[-1]
    liar_id = ids(4)[0]
    lying, now = _coordinator(per_client_shares=True)
    lied = _run(lying, now, 12, lie={liar_id: 1})[-1]  # it says its result came at once
    assert lied[liar_id] <= baseline[liar_id]


def test_a_trainer_that_delays_its_result_only_lowers_its_own_share() -> None:
    honest, now = _coordinator(per_client_shares=True)
    baseline = _run(honest, now, 12)[-1]
    sandbagger = ids(4)[3]
    coord, now = _coordinator(per_client_shares=True)
    delayed = _run(coord, now, 12, delay={sandbagger: 2000})[-1]  # it plays slow
    assert delayed[sandbagger] < baseline[sandbagger] // 2
    assert all(delayed[other] >= baseline[other] for other in ids(4)[:3])


def test_with_the_option_off_shares_are_equal_and_nothing_is_stored() -> None:
    coord, now = _coordinator()
    history = _run(coord, now, 6)
    assert all(set(samples.values()) == {16} for samples in history)
    assert all(not r.shares for r in coord.epoch_state.rounds)
    assert all(c.rate == 0 for c in coord.epoch_state.clients)
    assert all(not w.result_ms for r in coord.epoch_state.rounds for w in r.witnesses)
    round_ = coord.current_round()
    assert sorted(assign_data_for_state(coord)) == split_batch(round_.data_index, 64, 4)
    assert "per_client_shares" not in coord.config.to_toml()
    assert all(len(c) == 3 for c in coord.to_wire()["epoch_state"]["clients"])


def test_shares_survive_the_wire_and_the_state_file() -> None:
    coord, now = _coordinator(per_client_shares=True, max_share_multiple=3)
    _run(coord, now, 6)
    coord.witness(
        round_witnesses(coord)[0],
        dataclasses.replace(
            round_witness_for(coord, round_witnesses(coord)[0], ids(4)), result_ms=[5, 6, 7, 8]
        ),
        now + 100,
    )
    decoded = Coordinator.from_wire(coord.to_wire())
    assert decoded.to_wire() == coord.to_wire()
    assert decoded.current_round().shares == coord.current_round().shares != []
    assert [c.rate for c in decoded.epoch_state.clients] == [
        c.rate for c in coord.epoch_state.clients
    ]
    assert decoded.current_round().witnesses[0].result_ms == [5, 6, 7, 8]
    assert decoded.config.max_share_multiple == 3 and decoded.config.per_client_shares
    table = epoch_state_to_toml(coord.epoch_state)
    assert epoch_state_from_toml(table).to_wire() == _unseeded(coord.epoch_state.to_wire())
    saved = coord.to_state_file()
    assert Coordinator.from_state_file(saved).to_wire() == _unseeded(coord.to_wire())


@pytest.mark.parametrize(
    "field, value, message",
    [("result_ms", [-1], "not a u32"), ("shares", [0], "not a size")],
)
def test_bad_share_fields_are_refused(field: str, value: list[int], message: str) -> None:
    coord, now = _coordinator(per_client_shares=True)
    _run(coord, now, 3)
    wire = coord.to_wire()
    round_ = wire["epoch_state"]["rounds"][0]
    if field == "shares":
        round_["shares"] = value
    else:
        round_["witnesses"][0]["result_ms"] = value
    with pytest.raises(ValueError, match=message):
        Coordinator.from_wire(wire)


def test_a_rate_is_samples_per_witnessed_millisecond() -> None:
    coord, now = _coordinator(per_client_shares=True)
    _run(coord, now, 3)
    fastest = next(c for c in coord.epoch_state.clients if c.id == ids(4)[3])
    # round 0 gave 16 samples: OVERHEAD_MS + 16 * 100 / 4 ms, then averaged with round 1
    first = 16 * RATE_SCALE // (OVERHEAD_MS + 400)
    assert fastest.rate >= first


def test_a_saved_state_file_resumes_with_the_rates_and_the_option(tmp_path) -> None:
    from psyche_common.config import load_state
    from psyche_server.persistence import save_state

    coord, now = _coordinator(per_client_shares=True, max_share_multiple=3)
    _run(coord, now, 6)
    rates = {c.id: c.rate for c in coord.epoch_state.clients}
    assert all(rates.values())
    resumed = Coordinator.from_state_file(load_state(save_state(coord, tmp_path)))
    assert resumed.config.per_client_shares and resumed.config.max_share_multiple == 3
    assert {c.id: c.rate for c in resumed.epoch_state.clients} == rates
    assert [r.shares for r in resumed.epoch_state.rounds] == [
        r.shares for r in coord.epoch_state.rounds
    ]
    # the next epoch's members keep their rates: a returning member is not new
    resumed.run_state_start_unix_timestamp = 0
    resumed.tick(ids(4), now + 1000, 0)
    assert resumed.run_state == RunState.Warmup
    assert {c.id: c.rate for c in resumed.epoch_state.clients} == rates


def _accuse(coord: Coordinator, client_id: bytes, accuser: int = 0) -> int:
    index = coord.client_index(client_id)
    assert index is not None
    proof = CommitteeSelection.from_coordinator(coord, -1).get_committee(index)
    return coord.health_check(ids(4)[accuser], [(client_id, proof)])


def test_a_missed_round_shrinks_the_share_and_three_in_a_row_drop() -> None:
    coord, now = _coordinator(per_client_shares=True)
    fast = ids(4)[3]
    before = _run(coord, now, 8)[-1][fast]
    rate = next(c.rate for c in coord.epoch_state.clients if c.id == fast)
    _run(coord, now + 100, 1, unseen={0: fast})  # its result of the round before: unseen
    client = next(c for c in coord.epoch_state.clients if c.id == fast)
    assert client.misses == 1 and client.rate == rate // 2
    assert Coordinator.from_state_file(coord.to_state_file()).to_wire() == _unseeded(
        coord.to_wire()
    )
    assert Coordinator.from_wire(coord.to_wire()).epoch_state.clients[3].misses == 1
    assert assign_data_for_state(coord) and coord.current_round().shares
    shrunk = {owner: len(b) for b, owner in assign_data_for_state(coord).items()}[fast]
    assert shrunk < before
    with pytest.raises(CoordinatorError, match="accused healthy client"):
        _accuse(coord, fast)  # forgiven: an accusation is a false report
    _run(coord, now + 200, 1, unseen={0: fast})  # the round assigned before the miss was known
    assert client.misses == 2
    with pytest.raises(CoordinatorError, match="accused healthy client"):
        _accuse(coord, fast, accuser=1)  # (each false report counts against its sender)
    _run(coord, now + 300, 1, unseen={0: fast})  # missed with the smaller share too
    assert client.misses == 3
    assert _accuse(coord, fast) == 1


def test_without_shares_a_missed_round_drops_as_before() -> None:
    coord, now = _coordinator()
    _run(coord, now, 3, unseen={2: ids(4)[3]})
    assert _accuse(coord, ids(4)[3]) == 1

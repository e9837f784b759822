"""A mid-epoch joiner's weights report against the members' majority (`joiner_proofs`)."""

from __future__ import annotations

from psyche_common.coordinator import Coordinator, RunState
from psyche_common.coordinator.joining import snapshot_step
from psyche_server.consistency import WeightsHashMonitor
from psyche_server.joiner_proofs import JoinerProofs

from tests.support.coordinators import (
    ids,
    make_coordinator,
    round_witness_for,
    round_witnesses,
    to_round_train,
)

MEMBERS = ids(4)
JOINER = ids(1, salt="joiner")[0]
GOOD, BAD = b"\x01" * 32, b"\x02" * 32


def with_joiner() -> tuple[Coordinator, WeightsHashMonitor, int]:
    coord = make_coordinator(join_mid_epoch=True, epoch_time=100_000, total_steps=100_000)
    now = to_round_train(coord, MEMBERS)
    for witness_id in round_witnesses(coord):
        coord.witness(witness_id, round_witness_for(coord, witness_id, MEMBERS), now)
    now += coord.config.round_witness_time
    coord.tick([*MEMBERS, JOINER], now, now)
    assert coord.run_state == RunState.RoundTrain and coord.epoch_state.joining
    weights = WeightsHashMonitor()
    weights.set_members(MEMBERS)
    weights.advance(coord.progress.step)
    return coord, weights, snapshot_step(coord, coord.epoch_state.joining[0])


def test_a_joiner_matching_the_members_majority_is_marked_in_sync() -> None:
    coord, weights, step = with_joiner()
    proofs = JoinerProofs(coord, weights)
    proofs.offer(JOINER, step, GOOD)  # before the members' majority: kept
    assert not coord.epoch_state.joining[0].ready
    for member in MEMBERS[:3]:
        weights.record(step, member, GOOD)
    assert proofs.check() == [JOINER]
    assert coord.epoch_state.joining[0].ready


def test_a_joiner_with_other_weights_or_another_step_is_not() -> None:
    coord, weights, step = with_joiner()
    for member in MEMBERS:
        weights.record(step, member, GOOD)
        weights.record(step - 1, member, BAD)
    proofs = JoinerProofs(coord, weights)
    proofs.offer(JOINER, step, BAD)
    proofs.offer(JOINER, step - 1, BAD)  # the majority's hash, at a step that is no proof
    proofs.offer(MEMBERS[0], step, GOOD)  # a member's report is no joiner's proof
    assert proofs.check() == [] and not coord.epoch_state.joining[0].ready
    proofs.offer(JOINER, step, GOOD)  # a later, right report still counts
    assert coord.epoch_state.joining[0].ready

"""Joining mid-epoch on the coordinator (`psyche_common.coordinator.joining`): admission at a
round start, readiness, seating at a later round start, and what stays judgeable."""

from __future__ import annotations

from psyche_common.coordinator import ClientState, Coordinator, RunState
from psyche_common.coordinator.joining import (
    JOIN_TIMEOUT_ROUNDS,
    MAX_ADMITTED_PER_ROUND,
    snapshot_height,
    snapshot_step,
)
from psyche_common.coordinator.types import EpochState

from tests.support.coordinators import (
    ids,
    make_coordinator,
    round_witness_for,
    round_witnesses,
    to_round_train,
    witness_round,
)

MEMBERS = ids(4)
NEWCOMER = ids(1, salt="newcomer")[0]


def coordinator(join_mid_epoch: bool = True, **config: int) -> tuple[Coordinator, int]:
    coord = make_coordinator(
        join_mid_epoch=join_mid_epoch,
        epoch_time=100_000,
        total_steps=100_000,
        **config,
    )
    return coord, to_round_train(coord, MEMBERS)


def next_round(coord: Coordinator, now: int, pending: list[bytes]) -> int:
    """Every elected witness reports, and the round's time runs out with `pending` joined."""
    now = witness_round(coord, now, pending=pending)
    assert coord.run_state == RunState.RoundTrain
    return now


def test_a_pending_client_is_admitted_at_the_next_round_start_and_seated_once_ready() -> None:
    coord, now = coordinator()
    now = next_round(coord, now, [*MEMBERS, NEWCOMER])
    height = coord.current_round().height
    (joiner,) = coord.epoch_state.joining
    assert joiner.id == NEWCOMER and joiner.since_height == height and not joiner.ready
    assert coord.client_index(NEWCOMER) is None  # no committee, no batch yet
    assert snapshot_height(joiner) == height + 1
    assert snapshot_step(coord, joiner) == coord.progress.step + 1
    now = next_round(coord, now, [*MEMBERS, NEWCOMER])
    assert coord.client_index(NEWCOMER) is None  # not ready: still joining
    assert coord.joiner_in_sync(NEWCOMER)
    now = next_round(coord, now, [*MEMBERS, NEWCOMER])
    assert coord.client_index(NEWCOMER) == len(MEMBERS)  # appended: indices kept
    assert coord.epoch_state.joining == []
    round_ = coord.current_round()
    assert round_.seated == 1 and round_.clients_len == len(MEMBERS) + 1
    previous = coord.previous_round()
    assert previous is not None
    # the round before is still judgeable: its clients are a prefix of today's
    assert [c.id for c in coord.round_clients(previous) or []] == MEMBERS
    restored = Coordinator.from_state_file(coord.to_state_file())
    assert restored.current_round().seated == 1


def test_without_the_option_joiners_wait_for_the_next_epoch() -> None:
    coord, now = coordinator(join_mid_epoch=False)
    for _ in range(3):
        now = next_round(coord, now, [*MEMBERS, NEWCOMER])
    assert coord.epoch_state.joining == [] and coord.client_index(NEWCOMER) is None


def test_a_client_without_a_loaded_model_follows_from_the_round_after_it_has_one() -> None:
    coord, now = coordinator()
    members = [c.id for c in coord.epoch_state.clients]
    for witness_id in round_witnesses(coord):
        coord.witness(witness_id, round_witness_for(coord, witness_id, members), now)
    now += coord.config.round_witness_time
    coord.tick([*MEMBERS, NEWCOMER], now, now, holders=MEMBERS)
    assert coord.run_state == RunState.RoundTrain
    height = coord.current_round().height
    (joiner,) = coord.epoch_state.joining  # admitted: members let it link to them
    assert joiner.since_height == height + 1 and joiner.admitted_height == height
    now = next_round(coord, now, [*MEMBERS, NEWCOMER])  # it holds a model now
    assert coord.epoch_state.joining[0].since_height == height + 1


def test_removed_banned_and_crowds_are_bounded() -> None:
    coord, now = coordinator()
    crowd = ids(MAX_ADMITTED_PER_ROUND + 3, salt="crowd")
    dropped = MEMBERS[3]
    coord.epoch_state.clients[3].state = ClientState.Dropped
    now = next_round(coord, now, [*MEMBERS, *crowd])
    # a member a health check dropped this epoch waits for the next epoch
    assert coord.client_index(dropped) is None
    assert [j.id for j in coord.epoch_state.joining] == crowd[:MAX_ADMITTED_PER_ROUND]
    now = next_round(coord, now, [*MEMBERS[:3], *crowd])
    assert dropped not in {j.id for j in coord.epoch_state.joining}
    assert len(coord.epoch_state.joining) == len(crowd)


def test_a_joiner_that_leaves_or_never_gets_ready_is_removed() -> None:
    coord, now = coordinator()
    other = ids(1, salt="other")[0]
    now = next_round(coord, now, [*MEMBERS, NEWCOMER, other])
    now = next_round(coord, now, [*MEMBERS, NEWCOMER])  # `other` disconnected
    assert [j.id for j in coord.epoch_state.joining] == [NEWCOMER]
    since = coord.epoch_state.joining[0].since_height
    for _ in range(JOIN_TIMEOUT_ROUNDS):
        now = next_round(coord, now, [*MEMBERS, NEWCOMER])
    # removed after the timeout, then admitted afresh (a new snapshot round)
    (again,) = coord.epoch_state.joining
    assert again.id == NEWCOMER and again.since_height > since
    assert not coord.joiner_in_sync(other)


def test_joiners_are_in_the_broadcast_but_not_in_the_saved_state() -> None:
    coord, now = coordinator()
    next_round(coord, now, [*MEMBERS, NEWCOMER])
    copy = Coordinator.from_wire(coord.to_wire())
    assert copy.epoch_state.joining == coord.epoch_state.joining
    saved = coord.to_state_file()
    assert saved.epoch_state is not None
    assert "joining" not in saved.epoch_state.to_toml()
    assert EpochState().to_wire().get("joining") is None  # the wire form without joiners


def test_per_client_shares_give_a_seated_joiner_a_small_first_share() -> None:
    coord, now = coordinator(per_client_shares=True)
    for client, rate in zip(coord.epoch_state.clients, (400, 800, 800, 1600), strict=True):
        client.rate = rate
    now = next_round(coord, now, [*MEMBERS, NEWCOMER])
    coord.joiner_in_sync(NEWCOMER)
    next_round(coord, now, [*MEMBERS, NEWCOMER])
    index = coord.client_index(NEWCOMER)
    assert index is not None
    assert 0 < coord.epoch_state.clients[index].rate <= 200


def test_the_server_dashboard_shows_where_each_joiner_is() -> None:
    from psyche_server.tui.view_model import joiners_text

    coord, now = coordinator()
    assert joiners_text(coord) == ""
    next_round(coord, now, [*MEMBERS, NEWCOMER])
    assert "fetching the model" in joiners_text(coord)
    coord.joiner_in_sync(NEWCOMER)
    assert "in sync, seated next round" in joiners_text(coord)

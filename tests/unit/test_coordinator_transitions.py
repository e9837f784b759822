"""Run-state transitions of the coordinator (spec §1.3–1.13 and §8.1), one behaviour per test."""

from __future__ import annotations

import pytest
from psyche_common.config import (
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from psyche_common.coordinator import (
    MAX_CLIENTS,
    ClientState,
    CoordinatorError,
    ErrorKind,
    RunState,
    TickResult,
)

from tests.support.coordinators import (
    ids,
    make_coordinator,
    round_witness_for,
    round_witnesses,
    start_epoch,
    to_round_train,
    warmup_witness_for,
    witness_round,
)

A, B, C, D = ids(4)


def test_defaults_step_starts_at_one() -> None:
    coord = make_coordinator()
    assert coord.progress.step == 1
    assert coord.progress.epoch == 0
    assert coord.epoch_state.first_round
    assert coord.previous_round() is None and coord.previous_previous_round() is None


def test_waiting_for_members_needs_init_min_clients() -> None:
    coord = make_coordinator(init_min_clients=3, min_clients=2)
    assert coord.tick([A, B], 100, 0) == TickResult.ticked()
    assert coord.run_state == RunState.WaitingForMembers
    assert coord.tick(None, 100, 0) == TickResult.ticked()
    coord.tick([A, B, C], 101, 0)
    assert coord.run_state == RunState.Warmup
    assert [c.id for c in coord.epoch_state.clients] == [A, B, C]
    assert coord.epoch_state.start_timestamp == 101
    assert coord.epoch_state.start_step == 1
    assert coord.run_state_start_unix_timestamp == 101


def test_extra_time_is_measured_from_entering_waiting_for_members() -> None:
    coord = make_coordinator(waiting_for_members_extra_time=3)
    coord.run_state_start_unix_timestamp = 500
    coord.tick([A, B], 500, 0)  # same second: never a timeout
    coord.tick([A, B], 502, 0)
    assert coord.run_state == RunState.WaitingForMembers
    coord.tick([A, B], 503, 0)
    assert coord.run_state == RunState.Warmup


def test_duplicate_pending_ids_join_once_and_at_most_256_join() -> None:
    coord = make_coordinator()
    coord.tick([A, A, B, A], 10, 0)
    assert [c.id for c in coord.epoch_state.clients] == [A, B]
    many = ids(300, "many")
    coord2 = make_coordinator()
    coord2.tick(many, 10, 0)
    assert [c.id for c in coord2.epoch_state.clients] == many[:MAX_CLIENTS]


def test_pending_id_of_wrong_length_is_rejected_clearly() -> None:
    coord = make_coordinator()
    with pytest.raises(ValueError, match="32 bytes"):
        coord.tick([A, b"short"], 10, 0)
    assert coord.run_state == RunState.WaitingForMembers


def test_check_timeout_never_fires_in_the_first_second() -> None:
    coord = make_coordinator()
    coord.run_state_start_unix_timestamp = 50
    assert not coord.check_timeout(50, 0)
    assert coord.check_timeout(51, 0)
    assert not coord.check_timeout(54, 5)
    assert coord.check_timeout(55, 5)


def test_warmup_timeout_builds_round_zero() -> None:
    coord = make_coordinator()
    coord.progress.epoch_start_data_index = 40
    start_epoch(coord, [A, B], 1000)
    coord.tick([A, B], 1004, 9)
    assert coord.run_state == RunState.Warmup
    coord.tick([A, B], 1005, 1234)
    assert coord.run_state == RunState.RoundTrain
    current = coord.current_round()
    assert (coord.epoch_state.rounds_head, current.height, current.data_index) == (0, 0, 40)
    assert (current.random_seed, current.clients_len, current.witnesses) == (1234, 2, [])


def test_warmup_witness_quorum_starts_training_early_with_its_seed() -> None:
    coord = make_coordinator(witness_nodes=1)
    start_epoch(coord, [A, B], 1000)
    coord.warmup_witness(B, warmup_witness_for(coord, B), 1001, 77)
    assert coord.run_state == RunState.RoundTrain
    assert coord.current_round().random_seed == 77
    assert coord.run_state_start_unix_timestamp == 1001


def test_warmup_with_witness_nodes_zero_waits_for_every_client() -> None:
    coord = make_coordinator(witness_nodes=0, min_clients=3, init_min_clients=3)
    start_epoch(coord, [A, B, C], 1000)
    coord.warmup_witness(A, warmup_witness_for(coord, A), 1001, 1)
    coord.warmup_witness(B, warmup_witness_for(coord, B), 1001, 2)
    assert coord.run_state == RunState.Warmup
    coord.warmup_witness(C, warmup_witness_for(coord, C), 1002, 3)
    assert coord.run_state == RunState.RoundTrain


def test_client_leaving_in_warmup_goes_back_to_waiting() -> None:
    # state_change_shutdown_node_in_warmup: one of two clients disconnects during Warmup.
    coord = make_coordinator()
    start_epoch(coord, [A, B], 1000)
    coord.withdraw(coord.client_index(B))
    result = coord.tick([A], 1001, 0)
    assert result == TickResult.epoch_end(False)
    assert coord.run_state == RunState.WaitingForMembers
    assert len(coord.epoch_state.clients) == 1
    assert coord.epoch_state.exited_clients[0].id == B
    assert coord.progress.epoch == 0


def test_warmup_timeout_with_too_few_clients_abandons_the_epoch() -> None:
    coord = make_coordinator()
    start_epoch(coord, [A, B], 1000)
    coord.withdraw(0)
    # On the timeout path the withdrawn client still counts (no exit move first).
    assert coord.tick([B], 1005, 0) == TickResult.ticked()
    assert coord.run_state == RunState.RoundTrain
    coord3 = make_coordinator(min_clients=3, init_min_clients=3)
    start_epoch(coord3, [A, B, C], 1000)
    coord3.epoch_state.clients.pop()
    assert coord3.tick([A, B], 1005, 0) == TickResult.epoch_end(False)
    assert coord3.run_state == RunState.WaitingForMembers


def test_round_train_timeout_goes_to_witness() -> None:
    coord = make_coordinator()
    now = to_round_train(coord, [A, B])
    coord.tick([A, B], now + 4, 0)
    assert coord.run_state == RunState.RoundTrain
    coord.tick([A, B], now + 5, 0)
    assert coord.run_state == RunState.RoundWitness


def test_round_witness_timeout_starts_next_round_and_counts_step() -> None:
    coord = make_coordinator()
    now = to_round_train(coord, [A, B])
    first = coord.current_round()
    now = witness_round(coord, now)
    assert coord.run_state == RunState.RoundTrain
    assert coord.progress.step == 2
    assert not coord.epoch_state.first_round
    current = coord.current_round()
    assert coord.epoch_state.rounds_head == 1
    assert (current.height, current.data_index) == (1, first.data_index + 4)
    # the round's seed was drawn (and published) when the previous round began; the tick's
    # seed becomes the seed of the round after it
    assert current.random_seed == first.next_random_seed
    assert current.next_random_seed == now
    assert coord.previous_round() is first
    assert coord.previous_previous_round() is None  # the reference may return a zeroed slot


def test_ring_buffer_wraps_after_four_rounds() -> None:
    coord = make_coordinator()
    now = to_round_train(coord, [A, B])
    seen = [(coord.epoch_state.rounds_head, coord.current_round().height)]
    for _ in range(5):
        now = witness_round(coord, now)
        seen.append((coord.epoch_state.rounds_head, coord.current_round().height))
    assert seen == [(0, 0), (1, 1), (2, 2), (3, 3), (0, 4), (1, 5)]
    assert coord.previous_round().height == 4
    assert coord.previous_previous_round().height == 3
    assert [r.data_index for r in coord.epoch_state.rounds] == [16, 20, 8, 12]


def test_zero_witnesses_withdraws_everyone_and_cools_down() -> None:
    coord = make_coordinator()
    now = to_round_train(coord, [A, B])
    coord.tick([A, B], now + 5, 0)
    coord.tick([A, B], now + 7, 0)
    assert coord.run_state == RunState.Cooldown
    assert coord.progress.step == 2
    assert all(c.state == ClientState.Withdrawn for c in coord.epoch_state.clients)
    result = coord.tick([A, B], now + 12, 0)
    assert result == TickResult.epoch_end(True)
    assert coord.epoch_state.clients == []
    assert {c.id for c in coord.epoch_state.exited_clients} == {A, B}


def test_missing_witness_quorum_goes_to_cooldown() -> None:
    coord = make_coordinator(witness_nodes=3, min_clients=3, init_min_clients=3)
    now = to_round_train(coord, [A, B, C])
    elected = round_witnesses(coord)
    assert len(elected) == 3
    coord.witness(elected[0], round_witness_for(coord, elected[0], [A, B, C]), now)
    coord.tick([A, B, C], now + 5, 0)
    coord.tick([A, B, C], now + 7, 0)
    assert coord.run_state == RunState.Cooldown  # 1 witness < quorum 2
    assert all(c.state == ClientState.Healthy for c in coord.epoch_state.clients)


def test_too_few_clients_at_witness_timeout_goes_to_cooldown() -> None:
    coord = make_coordinator(min_clients=2, init_min_clients=3)
    now = to_round_train(coord, [A, B, C])
    coord.withdraw(coord.client_index(B))
    coord.withdraw(coord.client_index(C))
    now = witness_round(coord, now, seen=[A])
    assert coord.run_state == RunState.Cooldown
    assert [c.id for c in coord.epoch_state.clients] == [A]
    assert coord.epoch_state.exited_clients[0].exited_height == 0


def test_epoch_timeout_gives_exactly_two_flush_rounds() -> None:
    coord = make_coordinator(epoch_time=30)
    now = to_round_train(coord, [A, B])  # epoch started at 1000
    training_flags = [coord.is_training_round()]
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
        if coord.run_state == RunState.RoundTrain:
            training_flags.append(coord.is_training_round())
    assert coord.run_state == RunState.Cooldown
    assert training_flags[-2:] == [False, False]
    assert all(training_flags[:-2])
    assert coord.epoch_state.last_step == coord.progress.step
    # The flush rounds still move the data cursor forward.
    heights = len(training_flags)
    assert coord.current_round().data_index == 4 * (heights - 1)


def test_total_steps_leads_to_cooldown_then_finished() -> None:
    coord = make_coordinator(total_steps=3)
    now = to_round_train(coord, [A, B])
    steps_trained = [coord.progress.step]
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
        if coord.run_state == RunState.RoundTrain:
            steps_trained.append(coord.progress.step)
    assert steps_trained == [1, 2]
    assert coord.run_state == RunState.Cooldown and coord.progress.step == 3
    assert coord.tick([A, B], now + 5, 0) == TickResult.epoch_end(True)
    assert coord.run_state == RunState.Finished
    assert coord.halted()
    with pytest.raises(CoordinatorError) as excinfo:
        coord.tick([A, B], now + 6, 0)
    assert excinfo.value.kind == ErrorKind.Halted


def test_cooldown_end_carries_the_data_cursor_and_counts_the_epoch() -> None:
    coord = make_coordinator(epoch_time=20)
    now = to_round_train(coord, [A, B])
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
    last = coord.current_round()
    assert coord.current_round().witnesses == []  # cleared by start_cooldown
    coord.tick([A, B], now + 4, 0)
    assert coord.run_state == RunState.Cooldown
    assert coord.tick([A, B], now + 5, 0) == TickResult.epoch_end(True)
    assert coord.progress.epoch == 1
    assert coord.progress.epoch_start_data_index == last.data_index + 4
    assert coord.run_state == RunState.WaitingForMembers
    assert isinstance(coord.model.checkpoint, P2PCheckpoint)
    assert coord.model.checkpoint.repo_id == "builtin:llama-tiny"
    # The next epoch starts where the cursor stopped; step continues.
    step = coord.progress.step
    coord.tick([A, B], now + 5 + 3, 5)
    assert coord.run_state == RunState.Warmup
    assert coord.epoch_state.start_step == step
    coord.tick([A, B], now + 13, 5)
    assert coord.current_round().data_index == last.data_index + 4
    assert isinstance(coord.model.checkpoint, P2PCheckpoint)  # a member came back


@pytest.mark.parametrize(
    ("initial", "after_cooldown", "after_turnover"),
    [
        ({"Hub": {"repo_id": "org/m", "revision": "r1"}}, P2PCheckpoint, HubCheckpoint),
        ({"Dummy": {"repo_id": ""}}, P2PCheckpoint, HubCheckpoint),
        ({"Gcs": {"bucket": "b", "prefix": "p"}}, P2PGcsCheckpoint, GcsCheckpoint),
    ],
)
def test_checkpoint_switches_to_p2p_and_falls_back(
    initial: dict, after_cooldown: type, after_turnover: type
) -> None:
    coord = make_coordinator(model={"checkpoint": initial})
    now = to_round_train(coord, [A, B])
    coord.pause(now)  # pending pause: the next witness timeout ends the epoch
    now = witness_round(coord, now)
    coord.tick([A, B], now + 5, 0)
    assert coord.run_state == RunState.Paused
    assert isinstance(coord.model.checkpoint, after_cooldown)
    coord.resume(now + 6)
    # Entirely new members: nobody can serve the model peer-to-peer.
    coord.tick([C, D], now + 10, 0)
    assert coord.run_state == RunState.Warmup
    assert type(coord.model.checkpoint) is after_turnover
    if after_turnover is HubCheckpoint and "Hub" in initial:
        assert coord.model.checkpoint.revision == "r1"


def test_pause_in_waiting_or_warmup_is_immediate() -> None:
    coord = make_coordinator()
    start_epoch(coord, [A, B], 1000)
    coord.pause(1001)
    assert coord.run_state == RunState.Paused
    assert coord.epoch_state.cold_start_epoch
    assert all(c.state == ClientState.Withdrawn for c in coord.epoch_state.clients)
    for call in (lambda: coord.pause(1002), lambda: coord.tick([A, B], 1002, 0)):
        with pytest.raises(CoordinatorError) as excinfo:
            call()
        assert excinfo.value.kind == ErrorKind.Halted
    coord.resume(1003)
    assert coord.run_state == RunState.WaitingForMembers
    with pytest.raises(CoordinatorError) as excinfo:
        coord.resume(1004)
    assert excinfo.value.kind == ErrorKind.CannotResume


def test_pause_while_active_is_deferred_to_cooldown_end() -> None:
    coord = make_coordinator(model={"cold_start_warmup_steps": 3})
    now = to_round_train(coord, [A, B])
    now = witness_round(coord, now)
    coord.pause(now)
    assert coord.pending_pause and coord.run_state == RunState.RoundTrain
    now = witness_round(coord, now)
    assert coord.run_state == RunState.Cooldown
    assert coord.tick([A, B], now + 5, 0) == TickResult.epoch_end(True)
    assert coord.run_state == RunState.Paused
    assert not coord.pending_pause
    assert coord.epoch_state.cold_start_epoch
    coord.resume(now + 6)
    coord.tick([A, B], now + 9, 0)
    assert coord.run_state == RunState.Warmup
    assert coord.epoch_state.cold_start_epoch  # survives the epoch-start reset
    start = coord.epoch_state.start_step
    assert coord.get_cold_start_warmup_bounds() == (start, start + 3)


def test_cold_start_is_cleared_by_a_normal_cooldown() -> None:
    coord = make_coordinator(model={"cold_start_warmup_steps": 3}, epoch_time=20)
    coord.epoch_state.cold_start_epoch = True
    now = to_round_train(coord, [A, B])
    assert coord.get_cold_start_warmup_bounds() is not None
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
    coord.tick([A, B], now + 5, 0)
    assert not coord.epoch_state.cold_start_epoch
    assert coord.get_cold_start_warmup_bounds() is None


def test_withdraw_rules() -> None:
    coord = make_coordinator()
    start_epoch(coord, [A, B])
    for bad in (-1, 2, 99):
        with pytest.raises(CoordinatorError) as excinfo:
            coord.withdraw(bad)
        assert excinfo.value.kind == ErrorKind.InvalidWithdraw
    coord.withdraw(1)
    assert coord.epoch_state.clients[1].state == ClientState.Withdrawn
    with pytest.raises(CoordinatorError):
        coord.withdraw(1)
    coord.withdraw_all()
    assert coord.epoch_state.clients[0].state == ClientState.Withdrawn


def test_active_and_halted_predicates() -> None:
    coord = make_coordinator()
    expectations = {
        RunState.Uninitialized: (False, True),
        RunState.WaitingForMembers: (False, False),
        RunState.Warmup: (False, False),
        RunState.RoundTrain: (True, False),
        RunState.RoundWitness: (True, False),
        RunState.Cooldown: (True, False),
        RunState.Finished: (False, True),
        RunState.Paused: (False, True),
    }
    for state, (active, halted) in expectations.items():
        coord.run_state = state
        assert (coord.active(), coord.halted()) == (active, halted)
    assert RunState.RoundTrain.text == "Training"
    assert ErrorKind.WitnessesFull.text == "Witnesses full"


def test_historical_index_lookup() -> None:
    coord = make_coordinator()
    start_epoch(coord, [A, B, C, D])
    coord.epoch_state.clients[3].state = ClientState.Dropped
    coord.epoch_state.clients[2].state = ClientState.Withdrawn
    coord.move_clients_to_exited(0)
    assert coord.get_client_at_historical_index(0, 4).id == A
    assert coord.get_client_at_historical_index(2, 4).id == C
    assert coord.get_client_at_historical_index(3, 4).id == D
    assert coord.get_client_at_historical_index(4, 4) is None
    assert coord.get_client_at_historical_index(3, 9) is None


def test_first_round_of_an_epoch_publishes_a_distinct_next_seed() -> None:
    coord = make_coordinator()
    to_round_train(coord, [A, B])
    first = coord.current_round()
    assert first.next_random_seed not in (0, first.random_seed)


def test_round_timeouts_have_millisecond_resolution() -> None:
    coord = make_coordinator()
    now = to_round_train(coord, [A, B])
    train_time = coord.config.max_round_train_time
    coord.tick([A, B], now + train_time - 0.001, 0)
    assert coord.run_state == RunState.RoundTrain
    entered = now + train_time + 0.25
    coord.tick([A, B], entered, 0)
    assert coord.run_state == RunState.RoundWitness
    assert coord.run_state_start_ms == int(entered * 1000)
    witness_time = coord.config.round_witness_time
    coord.tick([A, B], entered + witness_time - 0.001, 0)
    assert coord.run_state == RunState.RoundWitness
    coord.tick([A, B], entered + witness_time, 0)
    assert coord.run_state != RunState.RoundWitness  # (nobody witnessed: on to Cooldown)
    assert coord.run_state_start_ms == int((entered + witness_time) * 1000)


def test_members_back_without_their_weights_cannot_keep_the_checkpoint_p2p() -> None:
    """Every member of the last epoch restarted its process (same keys, no weights: their
    Joins say so): nobody can serve the model peer-to-peer, so the next epoch loads the
    stored checkpoint instead of waiting for ever for peers that hold nothing. One of them
    back with its weights keeps it peer-to-peer."""
    for holders, expected in (([], HubCheckpoint), ([B], P2PCheckpoint), (None, P2PCheckpoint)):
        coord = make_coordinator(epoch_time=20)
        now = to_round_train(coord, [A, B])
        while coord.run_state == RunState.RoundTrain:
            now = witness_round(coord, now)
        coord.tick([A, B], now + 4, 0)
        assert coord.tick([A, B], now + 5, 0) == TickResult.epoch_end(True)
        assert isinstance(coord.model.checkpoint, P2PCheckpoint)
        coord.tick([A, B], now + 5 + 3, 5, holders=holders)
        assert coord.run_state == RunState.Warmup
        assert type(coord.model.checkpoint) is expected, holders

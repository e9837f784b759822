"""`resume_point`: what a server saves so that a restart resumes where the clients' weights are."""

from __future__ import annotations

from psyche_common.config import HubCheckpoint, P2PCheckpoint, parse_state
from psyche_common.coordinator import ClientState, Coordinator, RunState
from psyche_common.coordinator.resume import resume_point

from tests.support.coordinators import ids, make_coordinator, to_round_train, witness_round

A, B, C = ids(3)
OTHER = ids(3, "other")


def epoch_at_height(height: int, **config: int) -> tuple[Coordinator, int]:
    """A first epoch of A, B, C in RoundTrain of round `height`."""
    coord = make_coordinator(init_min_clients=3, **config)
    now = to_round_train(coord, [A, B, C])
    for _ in range(height):
        now = witness_round(coord, now)
    assert coord.run_state == RunState.RoundTrain
    assert coord.current_round().height == height
    return coord, now


def through_the_file(point: Coordinator) -> Coordinator:
    """What a server started from the saved point holds (TOML round trip + its reset)."""
    restarted = Coordinator.from_state_file(parse_state(point.to_state_file().to_toml_dict()))
    restarted.reset_ephemeral()
    return restarted


def test_mid_epoch_drops_the_rounds_in_flight_and_keeps_the_step() -> None:
    coord, _ = epoch_at_height(4)
    rounds = coord.epoch_state.rounds
    head = coord.epoch_state.rounds_head
    step = coord.progress.step
    point = resume_point(coord)
    assert point is not None
    assert coord.run_state == RunState.RoundTrain  # the live coordinator is untouched
    assert point.run_state == RunState.WaitingForMembers
    assert (point.progress.epoch, point.progress.step) == (0, step)
    # rounds 3 and 4 were in flight: the data cursor is round 3's first sample
    assert point.progress.epoch_start_data_index == rounds[(head - 1) % 4].data_index
    assert point.progress.epoch_start_data_index == 3 * coord.batch_size_at(0)
    assert isinstance(point.model.checkpoint, P2PCheckpoint)  # members hold trained weights
    assert isinstance(coord.model.checkpoint, HubCheckpoint)
    assert [c.id for c in point.epoch_state.clients] == [A, B, C]
    assert point.epoch_state.exited_clients == []


def test_round_witness_resumes_like_its_round_train() -> None:
    coord, now = epoch_at_height(3)
    in_train = resume_point(coord)
    coord.tick([A, B, C], now + coord.config.max_round_train_time, 0)
    assert coord.run_state == RunState.RoundWitness
    in_witness = resume_point(coord)
    assert in_train is not None and in_witness is not None
    assert in_witness.progress == in_train.progress
    assert in_witness.model.checkpoint == in_train.model.checkpoint


def test_before_anything_was_applied_the_epoch_restarts_from_its_start() -> None:
    for height in (0, 1):
        coord, _ = epoch_at_height(height)
        point = resume_point(coord)
        assert point is not None
        assert point.progress.epoch_start_data_index == 0
        assert point.progress.step == coord.progress.step
        # nobody holds weights beyond the initial checkpoint yet
        assert isinstance(point.model.checkpoint, HubCheckpoint)


def test_cooldown_resumes_as_the_end_of_the_cooldown_would() -> None:
    coord = make_coordinator(epoch_time=20)
    now = to_round_train(coord, [A, B])
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
    assert coord.run_state == RunState.Cooldown
    point = resume_point(coord)
    coord.tick([A, B], now + coord.config.cooldown_time, 0)
    assert coord.run_state == RunState.WaitingForMembers
    assert point is not None
    assert point.progress == coord.progress
    assert point.model.checkpoint == coord.model.checkpoint
    assert isinstance(point.model.checkpoint, P2PCheckpoint)
    assert point.epoch_state.clients == coord.epoch_state.clients
    assert point.epoch_state.cold_start_epoch is False


def test_a_pending_pause_at_cooldown_leaves_nobody_holding_the_model() -> None:
    coord = make_coordinator(epoch_time=20)
    now = to_round_train(coord, [A, B])
    coord.pause(now)
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
    assert coord.run_state == RunState.Cooldown
    point = resume_point(coord)
    assert point is not None
    assert point.run_state == RunState.WaitingForMembers and not point.pending_pause
    assert point.epoch_state.clients == []  # everyone withdrawn, as after a live pause
    assert point.epoch_state.cold_start_epoch


def test_warmup_has_no_resume_point_of_its_own() -> None:
    coord = make_coordinator()
    coord.tick([A, B], 1000, 0)
    assert coord.run_state == RunState.Warmup
    assert resume_point(coord) is None


def test_left_members_do_not_count_as_holders() -> None:
    coord, _ = epoch_at_height(3)
    coord.withdraw(coord.client_index(C))
    point = resume_point(coord)
    assert point is not None
    assert [c.id for c in point.epoch_state.clients] == [A, B]


def test_restart_from_a_mid_epoch_point_keeps_p2p_for_returning_members() -> None:
    coord, now = epoch_at_height(4)
    point = resume_point(coord)
    assert point is not None
    restarted = through_the_file(point)
    assert [(c.id, c.state) for c in restarted.epoch_state.clients] == [
        (A, ClientState.Healthy),
        (B, ClientState.Healthy),
        (C, ClientState.Healthy),
    ]
    restarted.tick([B, *OTHER[:2]], now + 100, 0)
    assert restarted.run_state == RunState.Warmup
    assert isinstance(restarted.model.checkpoint, P2PCheckpoint)
    assert restarted.epoch_state.start_step == coord.progress.step
    # the new epoch's first round trains from the cursor: round 3's samples again
    restarted.tick([B, *OTHER[:2]], now + 100 + restarted.config.warmup_time, 5)
    assert restarted.run_state == RunState.RoundTrain
    assert restarted.current_round().data_index == point.progress.epoch_start_data_index


def test_restart_from_a_mid_epoch_point_without_its_members_uses_the_hub() -> None:
    coord, now = epoch_at_height(4)
    point = resume_point(coord)
    assert point is not None
    restarted = through_the_file(point)
    restarted.tick(OTHER, now + 100, 0)
    assert restarted.run_state == RunState.Warmup
    assert isinstance(restarted.model.checkpoint, HubCheckpoint)


def test_a_run_at_its_last_step_resumes_finished() -> None:
    coord = make_coordinator(total_steps=4)
    now = to_round_train(coord, [A, B])
    while coord.run_state == RunState.RoundTrain:
        now = witness_round(coord, now)
    assert coord.run_state == RunState.Cooldown and coord.progress.step == 4
    point = resume_point(coord)
    assert point is not None
    assert point.run_state == RunState.Finished

"""Run-state transitions: `tick` for each state, round starts, cooldown, pause and resume
(reference sections 1.3–1.11). Every function takes the coordinator and mutates it."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

from psyche_common.client_id import CLIENT_ID_LEN
from psyche_common.coordinator import accusations, checkpoints, joining, shares
from psyche_common.coordinator.assignment import round_batch_size
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import (
    MAX_CLIENTS,
    NUM_STORED_ROUNDS,
    Client,
    ClientState,
    EpochState,
    RunState,
    TickResult,
    sample_commitment,
)

U64_MASK = (1 << 64) - 1
NEXT_SEED_DOMAIN = b"psyche-py/next-round-seed/v1\x00"
SAMPLE_SECRET_DOMAIN = b"psyche-py/derived-sample-secret/v1\x00"


def derive_seed(seed: int) -> int:
    """A second u64 from one random seed (the first round of an epoch needs two)."""
    digest = hashlib.sha256(NEXT_SEED_DOMAIN + (seed & U64_MASK).to_bytes(8, "big")).digest()
    return int.from_bytes(digest[:8], "big")


def derive_sample_secret(seed: int, height: int) -> bytes:
    """A round's verifier-sample seed when the caller passed no fresh secret (simulations and
    tests): anyone who knows `seed` can compute it, so the server never relies on it."""
    data = (seed & U64_MASK).to_bytes(8, "big") + height.to_bytes(8, "big")
    return hashlib.sha256(SAMPLE_SECRET_DOMAIN + data).digest()


def tick(
    coord: CoordinatorState,
    pending: Sequence[bytes] | None,
    now: float,
    seed: int,
    holders: Collection[bytes] | None = None,
    sample_secret: bytes | None = None,
) -> TickResult:
    """Advance the state machine for the clock `now`; `pending` are the joined client ids,
    `holders` those of them that hold the run's weights (None: all of them); `sample_secret`:
    32 fresh random bytes, the hidden verifier-sample seed of a round this tick starts."""
    state = coord.run_state
    if coord.halted():
        raise CoordinatorError(ErrorKind.Halted, f"run is {state.name}")
    if state == RunState.WaitingForMembers:
        return tick_waiting_for_members(coord, pending, now, holders)
    if state == RunState.Warmup:
        return tick_warmup(coord, now, seed, sample_secret, pending, holders)
    if state == RunState.RoundTrain:
        return tick_round_train(coord, now)
    if state == RunState.RoundWitness:
        return tick_round_witness(coord, now, seed, sample_secret, pending, holders)
    return tick_cooldown(coord, now)


def _unique_pending(pending: Sequence[bytes]) -> list[bytes]:
    unique = list(dict.fromkeys(pending))
    for client_id in unique:
        if not isinstance(client_id, bytes) or len(client_id) != CLIENT_ID_LEN:
            raise ValueError(f"pending client id {client_id!r:.80} is not {CLIENT_ID_LEN} bytes")
    return unique


def tick_waiting_for_members(
    coord: CoordinatorState,
    pending: Sequence[bytes] | None,
    now: float,
    holders: Collection[bytes] | None = None,
) -> TickResult:
    if pending is None:
        return TickResult.ticked()
    # a key convicted this epoch (a restart mid-epoch keeps its number) or on proof, ever
    unique = [
        client_id
        for client_id in _unique_pending(pending)
        if not coord.verification.banned(client_id, coord.progress.epoch)
    ]
    config = coord.config
    if len(unique) < config.init_min_clients or not coord.check_timeout(
        now, config.waiting_for_members_extra_time
    ):
        return TickResult.ticked()
    # the P2P checkpoint stays only when a member of the previous epoch is back *with* the
    # weights: one whose process restarted (same key, no model) cannot serve them
    serving = set(unique) if holders is None else set(unique) & set(holders)
    previous_members_present = any(
        client.state == ClientState.Healthy and client.id in serving
        for client in coord.epoch_state.clients
    )
    if not previous_members_present:
        coord.model.checkpoint = checkpoints.without_peers(coord.model.checkpoint)
    # a returning member keeps its measured rate (per-client shares; 0 for everyone else)
    rates = {client.id: client.rate for client in coord.epoch_state.clients}
    fresh = EpochState(
        clients=[
            Client(client_id, rate=rates.get(client_id, 0)) for client_id in unique[:MAX_CLIENTS]
        ],
        start_step=coord.progress.step,
        start_timestamp=int(now),
        first_round=True,
        cold_start_epoch=coord.epoch_state.cold_start_epoch,
    )
    coord.epoch_state = fresh
    coord.verification.new_epoch(coord.progress.epoch)  # earlier epochs' convictions go
    coord.change_state(now, RunState.Warmup)
    return TickResult.ticked()


def tick_warmup(
    coord: CoordinatorState,
    now: float,
    seed: int,
    sample_secret: bytes | None = None,
    pending: Sequence[bytes] | None = None,
    holders: Collection[bytes] | None = None,
) -> TickResult:
    if coord.check_timeout(now, coord.config.warmup_time):
        start_round_train(coord, now, seed, 0, sample_secret, pending, holders)
    else:
        coord.move_clients_to_exited(0)
    if len(coord.epoch_state.clients) < coord.config.min_clients:
        start_waiting_for_members(coord, now)
        return TickResult.epoch_end(False)
    return TickResult.ticked()


def start_round_train(
    coord: CoordinatorState,
    now: float,
    seed: int,
    tie_breaker_tasks: int,
    sample_secret: bytes | None = None,
    pending: Sequence[bytes] | None = None,
    holders: Collection[bytes] | None = None,
) -> None:
    """Start the next round; `sample_secret` (32 fresh random bytes, what the server passes)
    becomes its hidden verifier-sample seed (`Round.sample_seed`). Without it the seed is
    derived from `seed`, which the round publishes as the next round's: predictable, for
    simulations and tests only. With `join_mid_epoch`, ready joiners are seated first and
    `pending` clients (`holders` of them) admitted as joiners (`joining.round_start`)."""
    es = coord.epoch_state
    if es.first_round:
        head, height, data_index = 0, 0, coord.progress.epoch_start_data_index
        round_seed, next_seed = seed & U64_MASK, derive_seed(seed)
    else:
        if coord.config.per_client_shares:
            shares.update_rates(coord)  # the ending round's witnesses timed the one before
        previous = es.rounds[es.rounds_head]
        head = (es.rounds_head + 1) % NUM_STORED_ROUNDS
        height = previous.height + 1
        data_index = previous.data_index + round_batch_size(coord, previous)
        # drawn (and published) when the previous round began: clients derive this round's
        # roles and batches while the previous round's witnesses still report
        round_seed, next_seed = previous.next_random_seed, seed & U64_MASK
    seated = joining.round_start(
        coord, None if pending is None else _unique_pending(pending), holders, height
    )
    es.rounds_head = head
    round_ = es.rounds[head]
    round_.seated = seated
    round_.clients_len = len(es.clients)
    round_.height = height
    round_.data_index = data_index
    round_.tie_breaker_tasks = tie_breaker_tasks
    round_.random_seed = round_seed
    round_.next_random_seed = next_seed
    round_.sample_seed = sample_secret or derive_sample_secret(seed, height)
    round_.sample_commit = sample_commitment(round_.sample_seed)
    round_.sample_revealed = False
    round_.witnesses = []
    round_.shares = []
    if coord.config.per_client_shares:
        shares.assign_shares(coord, round_)
    accusations.prune(coord)
    coord.change_state(now, RunState.RoundTrain)


def tick_round_train(coord: CoordinatorState, now: float) -> TickResult:
    if coord.check_timeout(now, coord.config.max_round_train_time):
        start_round_witness(coord, now)
    return TickResult.ticked()


def start_round_witness(coord: CoordinatorState, now: float) -> None:
    """The round's witnesses are in (or its time is up): the previous step closes to
    verification reports and is judged before any client may apply its results."""
    coord.change_state(now, RunState.RoundWitness)
    coord.current_round().sample_revealed = True  # the round's results are committed
    accusations.judge_closed_step(coord)


def tick_round_witness(
    coord: CoordinatorState,
    now: float,
    seed: int,
    sample_secret: bytes | None = None,
    pending: Sequence[bytes] | None = None,
    holders: Collection[bytes] | None = None,
) -> TickResult:
    if not coord.check_timeout(now, coord.config.round_witness_time):
        return TickResult.ticked()
    es, config, progress = coord.epoch_state, coord.config, coord.progress
    es.first_round = False
    progress.step += 1
    current = coord.current_round()
    num_witnesses = len(current.witnesses)
    coord.move_clients_to_exited(current.height)
    if num_witnesses == 0:
        # Nobody witnessed: "witnesses left" cannot be told apart from "everyone left".
        coord.withdraw_all()
        start_cooldown(coord, now)
        return TickResult.ticked()
    if coord.check_epoch_timeout(now) and es.last_step == 0:
        last_step = progress.step + 2
        if last_step >= 4:
            es.last_step = last_step
    if es.last_step != 0 and progress.step == es.last_step:
        start_cooldown(coord, now)
        return TickResult.ticked()
    if (
        len(es.clients) < config.min_clients
        or num_witnesses < witness_quorum(config.witness_nodes, num_witnesses)
        or progress.step >= config.total_steps
        or coord.pending_pause
    ):
        start_cooldown(coord, now)
        return TickResult.ticked()
    start_round_train(coord, now, seed, 0, sample_secret, pending, holders)
    return TickResult.ticked()


def start_cooldown(coord: CoordinatorState, now: float) -> None:
    coord.current_round().witnesses = []
    coord.change_state(now, RunState.Cooldown)
    accusations.judge_closed_step(coord)  # the last round's reports, before its apply


def tick_cooldown(coord: CoordinatorState, now: float) -> TickResult:
    if not coord.check_timeout(now, coord.config.cooldown_time):
        return TickResult.ticked()
    pausing = coord.pending_pause
    finish_epoch(coord)
    if pausing:
        coord.change_state(now, RunState.Paused)
    else:
        start_waiting_for_members(coord, now)
    return TickResult.epoch_end(True)


def finish_epoch(coord: CoordinatorState) -> None:
    """The bookkeeping of a Cooldown that ends: the next epoch's data cursor and number, the
    non-Healthy members moved to exited, Hub→P2P (the members hold the model), and a pending
    pause withdraws everyone and makes the next epoch a cold start. The run state is left to
    the caller."""
    current = coord.current_round()
    coord.progress.epoch_start_data_index = current.data_index + round_batch_size(coord, current)
    coord.progress.epoch += 1
    coord.move_clients_to_exited(current.height)
    coord.model.checkpoint = checkpoints.after_cooldown(coord.model.checkpoint)
    if coord.pending_pause:
        coord.withdraw_all()
        coord.pending_pause = False
        coord.epoch_state.cold_start_epoch = True
    else:
        coord.epoch_state.cold_start_epoch = False


def start_waiting_for_members(coord: CoordinatorState, now: float) -> None:
    """WaitingForMembers, or Finished once `total_steps` is reached."""
    if coord.progress.step < coord.config.total_steps:
        coord.change_state(now, RunState.WaitingForMembers)
    else:
        coord.change_state(now, RunState.Finished)


def pause(coord: CoordinatorState, now: float) -> None:
    if coord.halted():
        raise CoordinatorError(ErrorKind.Halted, f"run is {coord.run_state.name}")
    if coord.active():
        coord.pending_pause = True
        return
    coord.withdraw_all()
    coord.change_state(now, RunState.Paused)
    coord.epoch_state.cold_start_epoch = True


def resume(coord: CoordinatorState, now: float) -> None:
    if coord.run_state != RunState.Paused:
        raise CoordinatorError(ErrorKind.CannotResume, f"run is {coord.run_state.name}")
    start_waiting_for_members(coord, now)

"""Global batch-size ramp, batch ids and the data assignment of a round (reference section 3).

A round's global batch is cut into `BatchId`s (inclusive ranges of global sample indices, see
`psyche_common.batch_id`); it starts at `round.data_index` and its size follows the batch-size
ramp, rounded half away from zero like Rust's `f64::round` (not Python's `round`). The trainers
of the round (committee selection, in index order) are shuffled with the LCG seeded by the
round's raw seed, then take `base + 1` samples (the first `remainder` of them) or `base` —
or, when the round carries per-client shares (`Round.shares`, set by `shares`), those sizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from psyche_common.batch_id import BatchId
from psyche_common.coordinator.committee import Committee, CommitteeSelection
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.shuffle import deterministic_shuffle

U16_MAX = 0xFFFF


class BatchSizeConfig(Protocol):
    """The batch-size ramp settings of a `[config]` (`CoordinatorConfig` has them)."""

    global_batch_size_start: int
    global_batch_size_end: int
    global_batch_size_warmup_tokens: int


class AssignmentConfig(BatchSizeConfig, Protocol):
    """The `[config]` settings a round's data assignment reads (`CoordinatorConfig` has them)."""

    witness_nodes: int
    verification_percent: int


def round_half_away_from_zero(x: float) -> int:
    """Rust's `f64::round`: halves go away from zero (Python's `round` goes to even)."""
    magnitude = math.floor(abs(x))
    if abs(x) - magnitude >= 0.5:
        magnitude += 1
    return magnitude if x >= 0 else -magnitude


def get_batch_size(config: BatchSizeConfig, tokens: int) -> int:
    """Samples per step after `tokens` tokens: the linear ramp from start to end size."""
    warmup_tokens = config.global_batch_size_warmup_tokens
    if tokens >= warmup_tokens:
        return config.global_batch_size_end
    progress = float(tokens) / float(warmup_tokens)
    start = float(config.global_batch_size_start)
    value = start + (float(config.global_batch_size_end) - start) * progress
    return max(0, min(U16_MAX, round_half_away_from_zero(value)))


class RoundLike(Protocol):
    """What the assignment reads from a coordinator round."""

    data_index: int
    random_seed: int
    tie_breaker_tasks: int


class ClientLike(Protocol):
    """An epoch member: only its 32-byte id matters here."""

    id: bytes


def round_batch_size(coordinator: CoordinatorState, round_: RoundLike | None) -> int:
    """`get_target_global_batch_size`: the batch size at the round's (or epoch's) data cursor."""
    index = round_.data_index if round_ is not None else coordinator.progress.epoch_start_data_index
    return get_batch_size(coordinator.config, index * coordinator.model.max_seq_len)


def batches_of_sizes(data_index: int, sizes: Sequence[int]) -> list[BatchId]:
    """Consecutive batch ids from `data_index`, one of each size (all at least 1)."""
    batches = []
    cursor = data_index
    for size in sizes:
        batches.append(BatchId(cursor, cursor + size - 1))
        cursor += size
    return batches


def round_batches(round_: RoundLike, batch_size: int, num_trainers: int) -> list[BatchId]:
    """The round's batches in trainer order: its shares when it has shares for exactly these
    trainers and this batch, else the equal split."""
    shares = getattr(round_, "shares", ())
    if shares and len(shares) == num_trainers and sum(shares) == batch_size:
        return batches_of_sizes(round_.data_index, shares)
    return split_batch(round_.data_index, batch_size, num_trainers)


def split_batch(data_index: int, batch_size: int, num_trainers: int) -> list[BatchId]:
    """Consecutive batch ids covering `[data_index, data_index + batch_size)`: the first
    `batch_size % num_trainers` have one sample more; empty shares are left out."""
    if num_trainers <= 0:
        raise ValueError(f"cannot split a batch across {num_trainers} trainers")
    base, remainder = divmod(batch_size, num_trainers)
    batches = []
    cursor = data_index
    for k in range(num_trainers):
        size = base + (1 if k < remainder else 0)
        if size == 0:
            break
        batches.append(BatchId(cursor, cursor + size - 1))
        cursor += size
    return batches


def trainer_ids(
    clients: Sequence[ClientLike],
    seed: int,
    witness_nodes: int,
    verification_percent: int,
    tie_breaker_tasks: int = 0,
) -> list[bytes]:
    """The round's trainers (committee `Trainer`, in index order), LCG-shuffled by `seed`."""
    trainers = committee_members(
        Committee.Trainer, clients, seed, witness_nodes, verification_percent, tie_breaker_tasks
    )
    return deterministic_shuffle(trainers, seed)


def committee_members(
    committee: Committee,
    clients: Sequence[ClientLike],
    seed: int,
    witness_nodes: int,
    verification_percent: int,
    tie_breaker_tasks: int = 0,
) -> list[bytes]:
    """The ids of the round's members of `committee`, in client-index order."""
    if not clients:
        return []
    selection = CommitteeSelection.new(
        tie_breaker_tasks, witness_nodes, verification_percent, len(clients), seed
    )
    return [
        c.id
        for c, chosen in zip(clients, selection.all_committees(), strict=True)
        if chosen == committee
    ]


def round_trainers(
    round_: RoundLike, clients: Sequence[ClientLike], config: AssignmentConfig
) -> list[bytes]:
    """The trainers of `round_` among `clients`, in the round's trainer order."""
    return trainer_ids(
        clients,
        round_.random_seed,
        config.witness_nodes,
        config.verification_percent,
        round_.tie_breaker_tasks,
    )


def assign_data_for_round(
    round_: RoundLike,
    clients: Sequence[ClientLike],
    config: AssignmentConfig,
    max_seq_len: int,
) -> dict[BatchId, bytes]:
    """Batch id → trainer client id for one round; the batches are in sample order."""
    trainers = round_trainers(round_, clients, config)
    if not trainers:
        return {}
    batch_size = get_batch_size(config, round_.data_index * max_seq_len)
    batches = round_batches(round_, batch_size, len(trainers))
    return dict(zip(batches, trainers, strict=False))


def assign_data_for_state(coordinator: CoordinatorState) -> dict[BatchId, bytes]:
    """Batch id → trainer client id for the coordinator's current round."""
    return assign_data_for_round(
        coordinator.current_round(),
        coordinator.epoch_state.clients,
        coordinator.config,
        coordinator.model.max_seq_len,
    )


def batches_for_client(assignment: dict[BatchId, bytes], client_id: bytes) -> list[BatchId]:
    """The batches of one client in an assignment, in sample order."""
    return sorted(batch for batch, owner in assignment.items() if owner == client_id)


def get_batch_ids_for_round(
    round_: RoundLike, coordinator: CoordinatorState, num_trainers: int
) -> list[BatchId]:
    """All batch ids of a round (no owners), as trainers would split it."""
    return round_batches(round_, round_batch_size(coordinator, round_), num_trainers)


def get_data_index_for_step(coordinator: CoordinatorState, target_step: int) -> int:
    """The data cursor at `target_step` assuming constant batch settings (0 if out of range)."""
    if target_step <= 1 or target_step > coordinator.config.total_steps:
        return 0
    index = 0
    for _ in range(1, target_step):
        index += get_batch_size(coordinator.config, index * coordinator.model.max_seq_len)
    return index

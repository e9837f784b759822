"""Witness blooms whose fill no honest witness can produce are refused (not in the reference).

A bloom with `K` keys sets at most `K` bits per entry, so a bloom holding `n` entries has at
most `K * n` bits set, whatever its keys. A witness's blooms describe one round's results:
the participant bloom holds one entry per trainer whose payload it verified, the broadcast
bloom one per batch, and a round has no more trainers or batches than it has clients. The
coordinator therefore refuses a witness whose bloom has more than `K * n` bits set, with `n`
the largest client count of the current and previous round (and of the epoch's list now).
An all-ones bloom, which would "contain" every result and every participant and so decide
consensus and health on its own, is refused whenever a round has fewer than 128 clients.

The bound is exact, never probabilistic: an honest bloom always passes it.

API: `max_bloom_entries(coord) -> int`, `check_witness_blooms(witness, entries, sender)`.
"""

from __future__ import annotations

from psyche_common.client_id import short_id
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import Witness


def max_bloom_entries(coord: CoordinatorState) -> int:
    """The most entries an honest witness bloom of the current moment can hold."""
    counts = [len(coord.epoch_state.clients), coord.current_round().clients_len]
    previous = coord.previous_round()
    if previous is not None:
        counts.append(previous.clients_len)
    return max(counts)


def check_witness_blooms(witness: Witness, entries: int, sender: bytes) -> None:
    """Raise `CoordinatorError(InvalidWitness)` naming the sender and the bloom when a bloom
    has more bits set than `entries` entries can set."""
    for name, bloom in (
        ("participant_bloom", witness.participant_bloom),
        ("broadcast_bloom", witness.broadcast_bloom),
    ):
        limit = min(len(bloom.keys) * entries, bloom.num_bits)
        filled = bloom.bit_count()
        if filled > limit:
            raise CoordinatorError(
                ErrorKind.InvalidWitness,
                f"witness from {short_id(sender)}: {name} has {filled} of {bloom.num_bits} "
                f"bits set, at most {limit} can come from {entries} entries "
                f"({len(bloom.keys)} bits each); the report is ignored",
            )

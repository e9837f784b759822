"""Witness blooms with an implausible fill are refused by the coordinator.

An all-ones bloom "contains" every result and every participant: with `witness_nodes = 1`
one lying witness would decide consensus for every batch and keep every trainer healthy.
A bloom of `n` entries has at most `keys * n` bits set, so the coordinator refuses more.
"""

from __future__ import annotations

import hashlib

import pytest
from psyche_client.round.consensus import select_consensus_commitment
from psyche_common.bloom import WITNESS_BLOOM_BITS, WITNESS_BLOOM_KEYS, Bloom
from psyche_common.coordinator import ClientState, CoordinatorError, ErrorKind, RunState, Witness
from psyche_common.coordinator.plausibility import check_witness_blooms, max_bloom_entries

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
ALL_ONES = (1 << WITNESS_BLOOM_BITS) - 1


def bloom_with_bits(count: int) -> Bloom:
    return Bloom(keys=tuple(range(1, WITNESS_BLOOM_KEYS + 1)), bits=(1 << count) - 1)


def lying_witness(
    coord, witness_id: bytes, participant_bloom: Bloom, broadcast_bloom: Bloom
) -> Witness:
    honest = round_witness_for(coord, witness_id, seen=[A])
    return Witness(honest.proof, participant_bloom, broadcast_bloom, honest.broadcast_merkle)


def at_height_one():
    coord = make_coordinator(min_clients=2, init_min_clients=4, global_batch_size_start=8,
                             global_batch_size_end=8)  # fmt: skip
    now = to_round_train(coord, [A, B, C, D])
    now = witness_round(coord, now)
    assert coord.current_round().height == 1
    (witness_id,) = round_witnesses(coord)
    return coord, witness_id, now


@pytest.mark.parametrize("which", ["participant_bloom", "broadcast_bloom"])
def test_an_all_ones_bloom_is_refused_and_not_stored(which: str) -> None:
    coord, witness_id, now = at_height_one()
    full = Bloom(keys=tuple(range(1, 9)), bits=ALL_ONES)
    blooms = {"participant_bloom": Bloom.random(), "broadcast_bloom": Bloom.random(), which: full}
    witness = lying_witness(coord, witness_id, **blooms)
    with pytest.raises(CoordinatorError) as excinfo:
        coord.witness(witness_id, witness, now)
    assert excinfo.value.kind == ErrorKind.InvalidWitness
    text = str(excinfo.value)
    assert which in text and witness_id[:4].hex() in text and "1024 of 1024" in text
    assert coord.current_round().witnesses == []
    assert coord.run_state == RunState.RoundTrain  # the lie did not end the round either


def test_the_bound_is_keys_times_the_round_clients() -> None:
    coord, witness_id, now = at_height_one()
    assert max_bloom_entries(coord) == 4
    limit = WITNESS_BLOOM_KEYS * 4
    check_witness_blooms(lying_witness(coord, witness_id, bloom_with_bits(limit), Bloom()), 4, A)
    with pytest.raises(CoordinatorError, match=f"{limit + 1} of 1024 bits set, at most {limit}"):
        check_witness_blooms(
            lying_witness(coord, witness_id, Bloom(), bloom_with_bits(limit + 1)), 4, A
        )
    # an honest witness that saw everything passes
    coord.witness(witness_id, round_witness_for(coord, witness_id, seen=[A, B, C, D]), now)
    assert len(coord.current_round().witnesses) == 1


def test_a_refused_all_ones_bloom_decides_no_consensus() -> None:
    """The lie would have chosen an arbitrary commitment; refused, it is never stored, so
    the clients' consensus (which reads the stored witnesses) cannot see it."""
    coord, witness_id, now = at_height_one()
    forged = [hashlib.sha256(b"forged result").digest(), hashlib.sha256(b"honest").digest()]
    full = Bloom(keys=tuple(range(1, 9)), bits=ALL_ONES)
    assert select_consensus_commitment(forged, [full], quorum=1) == 0  # the attack
    with pytest.raises(CoordinatorError):
        coord.witness(witness_id, lying_witness(coord, witness_id, full, full), now)
    stored = [w.broadcast_bloom for w in coord.current_round().witnesses]
    assert select_consensus_commitment(forged, stored, quorum=1) is None


def test_a_warmup_witness_with_a_full_bloom_is_refused() -> None:
    coord = make_coordinator(init_min_clients=2)
    now = start_epoch(coord, [A, B])
    honest = warmup_witness_for(coord, A)
    full = Bloom(keys=tuple(range(1, 9)), bits=ALL_ONES)
    with pytest.raises(CoordinatorError) as excinfo:
        coord.warmup_witness(A, Witness(honest.proof, full, Bloom()), now, 0)
    assert excinfo.value.kind == ErrorKind.InvalidWitness
    assert coord.current_round().witnesses == []
    assert coord.run_state == RunState.Warmup
    coord.warmup_witness(A, honest, now, 0)
    assert coord.run_state == RunState.RoundTrain  # the honest one ends Warmup


def test_a_witness_with_an_implausible_bloom_is_removed() -> None:
    """No honest witness can fill a bloom past `keys * entries`: one such witness is proof."""
    coord, witness_id, now = at_height_one()
    full = Bloom(keys=tuple(range(1, 9)), bits=ALL_ONES)
    with pytest.raises(CoordinatorError):
        coord.witness(witness_id, lying_witness(coord, witness_id, full, full), now)
    liar = next(c for c in coord.epoch_state.clients if c.id == witness_id)
    assert liar.state == ClientState.Dropped
    others = [c.state for c in coord.epoch_state.clients if c.id != witness_id]
    assert others == [ClientState.Healthy] * 3

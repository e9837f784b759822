"""Batch-size ramp, batch ids and data assignment: golden vectors (spec §9) and
data_selection.rs's unit tests (spec §8.2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator.assignment import (
    assign_data_for_round,
    batches_for_client,
    get_batch_ids_for_round,
    get_batch_size,
    get_data_index_for_step,
    round_half_away_from_zero,
    split_batch,
    trainer_ids,
)


@dataclass
class Cfg:
    global_batch_size_start: int = 4
    global_batch_size_end: int = 4
    global_batch_size_warmup_tokens: int = 0
    witness_nodes: int = 1
    verification_percent: int = 0
    total_steps: int = 100


@dataclass
class Rnd:
    data_index: int = 0
    random_seed: int = 0
    tie_breaker_tasks: int = 0


@dataclass
class Cl:
    id: bytes


@dataclass
class Model:
    max_seq_len: int = 2048


@dataclass
class Coord:
    config: Cfg
    model: Model = field(default_factory=Model)


def clients(n: int) -> list[Cl]:
    return [Cl(i.to_bytes(32, "big")) for i in range(n)]


def test_batch_id_basics() -> None:
    assert str(BatchId(5, 5)) == "B5"
    assert str(BatchId(3, 7)) == "B[3, 7]"
    assert len(BatchId(3, 7)) == 5
    assert 4 in BatchId(3, 7) and 8 not in BatchId(3, 7)
    assert BatchId.from_wire(BatchId(3, 7).to_wire()) == BatchId(3, 7)
    assert sorted([BatchId(9, 9), BatchId(0, 2)]) == [BatchId(0, 2), BatchId(9, 9)]
    with pytest.raises(ValueError, match="start <= end"):
        BatchId(4, 3)
    with pytest.raises(ValueError, match="start, end"):
        BatchId.from_wire([1])


def test_round_half_away_from_zero() -> None:
    assert round_half_away_from_zero(2.5) == 3
    assert round_half_away_from_zero(3.5) == 4
    assert round_half_away_from_zero(2.4999) == 2
    assert round_half_away_from_zero(-2.5) == -3
    assert round_half_away_from_zero(0.0) == 0


def test_get_batch_size_golden() -> None:
    assert get_batch_size(Cfg(2, 3, 100), 50) == 3  # Python's round() would give 2
    assert get_batch_size(Cfg(1, 2, 100), 50) == 2
    assert get_batch_size(Cfg(12288, 32768, 549755813888), 2_048_000_000) == 12364
    assert get_batch_size(Cfg(2, 9, 0), 0) == 9  # no ramp: no division by zero
    assert get_batch_size(Cfg(2, 9, 100), 100) == 9


def test_data_cursor_golden() -> None:
    coord = Coord(Cfg(4, 8, 20480))
    indices = [get_data_index_for_step(coord, step) for step in range(1, 8)]
    assert indices == [0, 4, 10, 18, 26, 34, 42]
    assert get_data_index_for_step(coord, 101) == 0


def sizes(assignment: dict[BatchId, bytes]) -> list[int]:
    return [len(b) for b in sorted(assignment)]


def test_even_distribution() -> None:
    cfg = Cfg(100, 100, 0, witness_nodes=0)
    result = assign_data_for_round(Rnd(), clients(4), cfg, 2048)
    assert sizes(result) == [25] * 4
    assert sum(sizes(result)) == 100


def test_uneven_distribution_with_remainder() -> None:
    cfg = Cfg(384, 384, 0, witness_nodes=0)
    result = assign_data_for_round(Rnd(), clients(23), cfg, 2048)
    assert sizes(result) == [17] * 16 + [16] * 7
    assert sorted(sizes(result)) == [16] * 7 + [17] * 16
    assert sum(sizes(result)) == 384


def test_larger_remainder() -> None:
    cfg = Cfg(13, 13, 0, witness_nodes=0)
    result = assign_data_for_round(Rnd(), clients(5), cfg, 2048)
    assert sorted(sizes(result)) == [2, 2, 3, 3, 3]


def test_assignment_golden_order() -> None:
    cs = clients(4)
    cfg = Cfg(10, 10, 0, witness_nodes=1)
    assert trainer_ids(cs, 99, 1, 0) == [cs[1].id, cs[3].id, cs[0].id, cs[2].id]
    result = assign_data_for_round(Rnd(data_index=0, random_seed=99), cs, cfg, 2048)
    assert result == {
        BatchId(0, 2): cs[1].id,
        BatchId(3, 5): cs[3].id,
        BatchId(6, 7): cs[0].id,
        BatchId(8, 9): cs[2].id,
    }
    assert batches_for_client(result, cs[0].id) == [BatchId(6, 7)]
    assert batches_for_client(result, b"\xff" * 32) == []


def test_assignment_starts_at_data_index_and_skips_empty_shares() -> None:
    cfg = Cfg(3, 3, 0, witness_nodes=0)
    result = assign_data_for_round(Rnd(data_index=50, random_seed=5), clients(5), cfg, 16)
    assert sorted(result) == [BatchId(50, 50), BatchId(51, 51), BatchId(52, 52)]
    assert len(set(result.values())) == 3


def test_no_clients_means_no_assignment() -> None:
    assert assign_data_for_round(Rnd(), [], Cfg(), 2048) == {}


def test_batch_ids_for_round() -> None:
    coord = Coord(Cfg(10, 10, 0), Model(16))
    assert get_batch_ids_for_round(Rnd(data_index=20), coord, 4) == [
        BatchId(20, 22),
        BatchId(23, 25),
        BatchId(26, 27),
        BatchId(28, 29),
    ]
    with pytest.raises(ValueError, match="0 trainers"):
        split_batch(0, 10, 0)

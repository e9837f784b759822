"""Committee and witness selection: golden vectors (spec §9) and committee_selection.rs tests."""

from __future__ import annotations

import pytest
from psyche_common.coordinator import Client
from psyche_common.coordinator.committee import (
    Committee,
    CommitteeProof,
    CommitteeSelection,
    CommitteeSelectionError,
    WitnessProof,
)

SEED = 12345


def test_new_committee_selection() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    assert (cs.tie_breaker_nodes, cs.witness_nodes, cs.verifier_nodes, cs.total_nodes) == (
        10,
        20,
        27,
        100,
    )


def test_golden_seed_and_positions() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    assert cs.seed.hex() == "e1543551249113046932741cc28f36b4bbcc542233eb5094874072d3167f160a"
    committee = [cs.get_committee(i) for i in range(10)]
    assert [p.position for p in committee] == [83, 58, 32, 29, 76, 82, 21, 88, 14, 56]
    verifiers = [i for i, p in enumerate(committee) if p.committee == Committee.Verifier]
    assert verifiers == [2, 3, 6, 8]
    assert all(
        p.committee == Committee.Trainer for i, p in enumerate(committee) if i not in verifiers
    )
    witness = [cs.get_witness(i) for i in range(10)]
    assert [p.position for p in witness] == [58, 86, 21, 7, 69, 31, 63, 29, 11, 88]
    assert [i for i, p in enumerate(witness) if p.witness] == [3, 8]


def test_golden_small_selection() -> None:
    cs = CommitteeSelection.new(0, 1, 0, 4, 7)
    assert [cs.get_witness(i).position for i in range(4)] == [3, 2, 1, 0]
    assert [cs.get_witness(i).witness for i in range(4)] == [False, False, False, True]
    assert [cs.get_committee(i).position for i in range(4)] == [3, 0, 1, 2]
    assert all(cs.get_committee(i).committee == Committee.Trainer for i in range(4))


def test_get_committee_rules() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    for i in range(100):
        proof = cs.get_committee(i)
        assert proof.position < 100 and proof.index == i
        expected = (
            Committee.TieBreaker
            if proof.position < 10
            else Committee.Verifier
            if proof.position < 37
            else Committee.Trainer
        )
        assert proof.committee == expected


def test_get_witness_rule() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    for i in range(100):
        proof = cs.get_witness(i)
        assert proof.position < 100
        assert proof.witness == (proof.position < 20)


def test_witness_nodes_zero_means_32() -> None:
    cs = CommitteeSelection.new(0, 0, 0, 100, SEED)
    assert sum(cs.get_witness(i).witness for i in range(100)) == 32
    small = CommitteeSelection.new(0, 0, 0, 5, SEED)
    assert all(small.get_witness(i).witness for i in range(5))


def test_verify_committee_and_forgery() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    for i in range(100):
        assert cs.verify_committee(cs.get_committee(i))
    honest = cs.get_committee(0)
    forged = CommitteeProof(Committee.Verifier, 99, 0)
    assert honest != forged
    assert not cs.verify_committee(forged)
    assert not cs.verify_committee(CommitteeProof(Committee.Trainer, 0, 100))  # index out of range


def test_verify_witness_and_forgery() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    for i in range(100):
        assert cs.verify_witness(cs.get_witness(i))
    honest = cs.get_witness(0)
    assert not cs.verify_witness(WitnessProof(99, 0, not honest.witness))
    assert not cs.verify_witness(WitnessProof(0, 1000, True))


def test_verify_for_client_checks_identity_and_bounds() -> None:
    clients = [Client(bytes([i]) * 32) for i in range(4)]
    cs = CommitteeSelection.new(0, 1, 0, 4, 7)
    proof = cs.get_witness(3)
    assert cs.verify_witness_for_client(clients[3].id, proof, clients)
    assert not cs.verify_witness_for_client(clients[2].id, proof, clients)
    assert not cs.verify_witness_for_client(clients[3].id, proof, clients[:3])
    cproof = cs.get_committee(1)
    assert cs.verify_committee_for_client(clients[1].id, cproof, clients)
    assert not cs.verify_committee_for_client(clients[0].id, cproof, clients)


def test_committee_distribution_is_exact() -> None:
    cs = CommitteeSelection.new(10, 20, 30, 100, SEED)
    counts = {c: 0 for c in Committee}
    for i in range(100):
        counts[cs.get_committee(i).committee] += 1
    assert counts == {Committee.TieBreaker: 10, Committee.Verifier: 27, Committee.Trainer: 63}
    assert sum(cs.get_witness(i).witness for i in range(100)) == 20
    assert cs.all_committees() == [cs.get_committee(i).committee for i in range(100)]
    assert cs.all_witness_flags() == [cs.get_witness(i).witness for i in range(100)]


def test_get_num_nodes() -> None:
    cs = CommitteeSelection.new(10, 5, 20, 100, SEED)
    assert (cs.tie_breaker_nodes, cs.verifier_nodes, cs.trainer_nodes) == (10, 18, 72)


def test_seed_consistency() -> None:
    assert CommitteeSelection.new(10, 20, 30, 100, SEED) == CommitteeSelection.new(
        10, 20, 30, 100, SEED
    )
    assert (
        CommitteeSelection.new(10, 20, 30, 100, SEED).seed
        != CommitteeSelection.new(10, 20, 30, 100, SEED + 1).seed
    )


@pytest.mark.parametrize(
    "args",
    [
        (10, 5, 0, 9),  # total < tie breakers
        (0, 5, 101, 100),  # verification > 100 %
        (0, 20, 0, 10),  # total < witness nodes
        (0, 0, 0, 2**64 - 1),  # total = u64::MAX
    ],
)
def test_invalid_committee_selections(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(CommitteeSelectionError):
        CommitteeSelection.new(*args, SEED)


def test_edge_case_all_tie_breakers() -> None:
    cs = CommitteeSelection.new(100, 0, 0, 100, SEED)
    assert all(cs.get_committee(i).committee == Committee.TieBreaker for i in range(100))


def test_edge_case_no_verifiers() -> None:
    cs = CommitteeSelection.new(10, 0, 0, 100, SEED)
    committees = [cs.get_committee(i).committee for i in range(100)]
    assert committees.count(Committee.TieBreaker) == 10
    assert committees.count(Committee.Trainer) == 90


def test_proof_wire_round_trip_and_validation() -> None:
    proof = CommitteeProof(Committee.Trainer, 12, 3)
    assert CommitteeProof.from_wire(proof.to_wire()) == proof
    wproof = WitnessProof(4, 2, True)
    assert WitnessProof.from_wire(wproof.to_wire()) == wproof
    assert WitnessProof.from_wire({"position": 4, "index": 2, "witness": 1}) == wproof
    with pytest.raises(ValueError, match="unknown committee"):
        CommitteeProof.from_wire({"committee": 9, "position": 0, "index": 0})
    with pytest.raises(ValueError, match="index"):
        WitnessProof.from_wire({"position": 0, "index": -1, "witness": True})

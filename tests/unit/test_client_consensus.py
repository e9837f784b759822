"""Unit tests of the client's pure apply-consensus, witness bookkeeping and health selection."""

from __future__ import annotations

import hashlib

from psyche_client.round.consensus import (
    Candidate,
    SkipReason,
    cold_start_steps,
    plan_apply,
    select_consensus_commitment,
    split_cold_start,
)
from psyche_client.round.health import clients_to_accuse
from psyche_client.round.witness_builder import (
    EMPTY_MERKLE_ROOT,
    RoundWitnessState,
    merkle_root,
)
from psyche_client.training.backend import DummyResult
from psyche_common.batch_id import BatchId
from psyche_common.config import HubCheckpoint, P2PCheckpoint
from psyche_common.coordinator.health import health_score, participant_key


class SetBloom:
    """An exact bloom stand-in (no false positives) for testing the selection rules."""

    def __init__(self, items: tuple[bytes, ...] = ()) -> None:
        self.items = set(items)

    def add(self, item: bytes) -> None:
        self.items.add(item)

    def contains(self, item: bytes) -> bool:
        return item in self.items


H = [bytes([i]) * 32 for i in range(6)]


def test_each_witness_votes_once_for_first_match() -> None:
    blooms = [SetBloom((H[0], H[1])), SetBloom((H[1],)), SetBloom((H[1],))]
    # witness 0 votes for H0 only (first match), so H1 has 2 votes, H0 has 1
    assert select_consensus_commitment([H[0], H[1]], blooms, quorum=2) == 1
    assert select_consensus_commitment([H[0], H[1]], blooms, quorum=3) is None


def test_tie_goes_to_last_index() -> None:
    blooms = [SetBloom((H[0],)), SetBloom((H[1],))]
    assert select_consensus_commitment([H[0], H[1]], blooms, quorum=1) == 1


def test_no_witnesses_gives_no_consensus() -> None:
    assert select_consensus_commitment([H[0]], [], quorum=1) is None


def test_plan_apply_orders_and_skips() -> None:
    a, b, c, d = "A", "B", "C", "D"
    blooms = [SetBloom((H[0], H[2], H[4])), SetBloom((H[0], H[4]))]
    candidates = {
        a: [Candidate(b"x", H[0])],
        b: [Candidate(b"y", H[2])],  # only one witness saw it: below quorum 2
        d: [Candidate(b"z", H[3]), Candidate(b"w", H[4])],
    }
    plan = plan_apply([a, b, c, d], candidates, blooms, quorum=2)
    assert [(batch, cand.commitment) for batch, cand in plan.apply] == [(a, H[0]), (d, H[4])]
    assert plan.skipped == [(b, SkipReason.NO_QUORUM), (c, SkipReason.NO_COMMITMENT)]


def test_cold_start_results_are_split_off_after_a_p2p_checkpoint() -> None:
    fresh, warm = DummyResult(b"", trainer_nonce=0), DummyResult(b"", trainer_nonce=3)
    kept, skipped = split_cold_start(
        [("A", fresh), ("B", warm)], cold_start_steps(P2PCheckpoint(repo_id="r").is_p2p, 2)
    )
    assert kept == [("B", warm)]
    assert skipped == [("A", SkipReason.COLD_START)]
    kept, skipped = split_cold_start(
        [("A", fresh)], cold_start_steps(HubCheckpoint(repo_id="r").is_p2p, 2)
    )
    assert (kept, skipped) == ([("A", fresh)], [])


def test_merkle_root_shapes() -> None:
    assert merkle_root([]) == EMPTY_MERKLE_ROOT
    leaf = hashlib.sha256(b"\x00" + H[1]).digest()
    assert merkle_root([H[1]]) == leaf
    l0, l1, l2 = (hashlib.sha256(b"\x00" + h).digest() for h in H[:3])
    n01 = hashlib.sha256(b"\x01" + l0 + l1).digest()
    n22 = hashlib.sha256(b"\x01" + l2 + l2).digest()
    assert merkle_root(H[:3]) == hashlib.sha256(b"\x01" + n01 + n22).digest()


def test_round_witness_state_records_first_payload_per_batch() -> None:
    state = RoundWitnessState.new(["b1", "b2"], 3, lambda n: SetBloom())
    assert not state.all_batches_seen
    assert state.record_verified(b"alice", "b1", H[0]) is True
    assert state.record_verified(b"bob", "b1", H[1]) is False
    assert state.broadcast_bloom.contains(H[0]) and not state.broadcast_bloom.contains(H[1])
    assert state.participant_bloom.contains(participant_key(b"bob"))
    assert state.record_verified(b"carol", "b2", H[2]) is True
    assert state.all_batches_seen
    # once everything is seen, later payloads change nothing (reference: blooms frozen)
    assert state.record_verified(b"dave", "b2", H[3]) is False
    assert not state.participant_bloom.contains(participant_key(b"dave"))


def test_round_witness_state_times_each_batchs_first_result() -> None:
    first, second, third = BatchId(0, 3), BatchId(4, 5), BatchId(6, 9)
    state = RoundWitnessState.new([first, second, third], 3, lambda n: SetBloom())
    state.record_verified(b"bob", second, H[1], elapsed_ms=700)
    state.record_verified(b"alice", first, H[0], elapsed_ms=300)
    state.record_verified(b"carol", first, H[2], elapsed_ms=900)  # not the first: kept 300
    assert state.timings([third, second, first]) == [300, 700, 0]  # sample order, 0: unseen


def test_round_without_batches_counts_as_all_seen() -> None:
    assert RoundWitnessState.new([], 2, lambda n: SetBloom()).all_batches_seen


def test_health_accuses_only_trainers_below_quorum() -> None:
    ids = [b"a" * 32, b"b" * 32, b"c" * 32]
    seen = (participant_key(ids[0]), participant_key(ids[2]))
    blooms = [SetBloom(seen), SetBloom((participant_key(ids[0]),))]
    assert health_score(ids[0], blooms) == 2
    accused = clients_to_accuse(
        ids,
        is_trainer=lambda i: i != 2,
        participant_blooms=blooms,
        quorum=2,
        proof_for=lambda i: ("proof", i),
    )
    assert accused == [(ids[1], ("proof", 1))]


def test_plan_apply_does_not_depend_on_arrival_order() -> None:
    # two commitments for one batch, each seen by one of two witnesses (quorum 1): which one
    # is applied must not depend on which announcement reached this client first
    blooms = [SetBloom((H[1],)), SetBloom((H[0],))]
    one = [Candidate(b"x", H[0]), Candidate(b"x", H[1])]
    plans = [
        plan_apply(["A"], {"A": order}, blooms, quorum=1).apply
        for order in (one, list(reversed(one)))
    ]
    assert plans[0] == plans[1]

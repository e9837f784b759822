"""The `Equivocation` client message: parsed strictly, checked by the coordinator with both
signatures, the trainer dropped, the record saved, the key never admitted again."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from psyche_common.announcements import ResultCommitment, commitment_statement
from psyche_common.batch_id import BatchId
from psyche_common.config import load_state
from psyche_common.coordinator import ClientState, Coordinator, CoordinatorError, RunState
from psyche_common.coordinator.assignment import assign_data_for_state, batches_for_client
from psyche_common.protocol import Identity, InvalidMessage, parse_client_message, to_wire
from psyche_common.protocol.messages import Equivocation
from psyche_server.client_messages import apply_client_message
from psyche_server.persistence import save_state

from tests.support.coordinators import coordinator_in

TRAINER, REPORTER = Identity.generate(), Identity.generate()
MEMBERS = [TRAINER.public_key, REPORTER.public_key, Identity.generate().public_key]
STEP = 6
ROUND = coordinator_in(RunState.RoundTrain, MEMBERS, step=STEP, height=2)
SEED = ROUND.current_round().random_seed
BATCH = batches_for_client(assign_data_for_state(ROUND), TRAINER.public_key)[0]
"""The batch the round of STEP assigned to TRAINER."""


def commitment(
    trainer: Identity,
    blob: bytes,
    batch: BatchId = BATCH,
    *,
    run_id: str = "test",
    seed: int = SEED,
    step: int = STEP,
) -> ResultCommitment:
    data_hash, blob_hash = hashlib.sha256(b"data").digest(), hashlib.sha256(blob).digest()
    statement = commitment_statement(
        run_id, seed, trainer.public_key, step, batch.start, batch.end, data_hash, blob_hash, 64
    )
    return ResultCommitment(
        run_id,
        seed,
        trainer.public_key,
        step,
        batch,
        data_hash,
        blob_hash,
        64,
        trainer.sign(statement),
    )


def message(first: ResultCommitment, second: ResultCommitment) -> Equivocation:
    return Equivocation(first=first.to_wire(), second=second.to_wire())


def round_train() -> Coordinator:
    return coordinator_in(RunState.RoundTrain, MEMBERS, step=STEP, height=2)


def test_a_members_proof_drops_the_trainer_and_the_ban_survives_a_restart(
    tmp_path: Path,
) -> None:
    coord = round_train()
    proof = message(commitment(TRAINER, b"blob a"), commitment(TRAINER, b"blob b"))
    assert parse_client_message(to_wire(proof)) == proof
    apply_client_message(coord, REPORTER.public_key, proof, 1000.0)
    index = coord.client_index(TRAINER.public_key)
    assert index is not None and coord.epoch_state.clients[index].state == ClientState.Dropped
    (recorded,) = coord.verification.convictions
    assert recorded.proven and recorded.verifiers == (REPORTER.public_key,)
    assert (recorded.trainer, recorded.step, recorded.batch) == (
        TRAINER.public_key,
        STEP - 1,  # RoundTrain of STEP: the results of STEP - 1 are not final yet
        BATCH,
    )
    loaded = Coordinator.from_state_file(load_state(save_state(coord, tmp_path)))
    assert loaded.verification.convictions == [recorded]
    # the next epoch does not admit the key
    waiting = coordinator_in(
        RunState.WaitingForMembers, [REPORTER.public_key, bytes(32)], step=STEP
    )
    waiting.verification = loaded.verification
    pending = [TRAINER.public_key, REPORTER.public_key, bytes(32)]
    waiting.tick(pending, 10_000.0, 1)
    assert waiting.run_state == RunState.Warmup
    assert TRAINER.public_key not in [c.id for c in waiting.epoch_state.clients]


def test_what_proves_nothing_is_refused() -> None:
    coord = round_train()
    a, b = commitment(TRAINER, b"blob a"), commitment(TRAINER, b"blob b")
    forged = ResultCommitment(**{**vars(b), "signature": a.signature})
    other = commitment(Identity.generate(), b"blob b")
    for second, why in ((a, "the same"), (forged, "does not verify"), (other, "different")):
        with pytest.raises(CoordinatorError, match=why):
            apply_client_message(coord, REPORTER.public_key, message(a, second), 1000.0)
    bad = Equivocation(first=a.to_wire(), second={**b.to_wire(), "data_hash": b"x"})
    with pytest.raises(InvalidMessage, match=r"proof\.second\.data_hash"):
        apply_client_message(coord, REPORTER.public_key, bad, 1000.0)
    # only members report (a stranger's key costs the server no signature checks)
    stranger = Identity.generate().public_key
    apply_client_message(coord, stranger, message(a, b), 1000.0)
    assert coord.verification.convictions == []


def test_a_replayed_or_stale_proof_is_refused() -> None:
    """Two commitments the trainer really signed, but not for this run's open window: another
    run (or the same run id before a restore: another round seed), a closed step, a batch
    the round never assigned to the trainer. None convicts it."""
    coord = round_train()
    other_batch = next(
        b for b, owner in assign_data_for_state(coord).items() if owner != TRAINER.public_key
    )
    replays = (
        ({"run_id": "another-run"}, "for run 'another-run', not 'test'"),
        ({"seed": SEED ^ 1}, "round seed"),
        ({"step": STEP - 2}, "closed to equivocation proofs"),
        ({"step": STEP + 1}, "closed to equivocation proofs"),
    )
    for changes, why in replays:
        a = commitment(TRAINER, b"blob a", **changes)  # type: ignore[arg-type]
        b = commitment(TRAINER, b"blob b", **changes)  # type: ignore[arg-type]
        with pytest.raises(CoordinatorError, match=why):
            apply_client_message(coord, REPORTER.public_key, message(a, b), 1000.0)
    a, b = commitment(TRAINER, b"blob a", other_batch), commitment(TRAINER, b"blob b", other_batch)
    with pytest.raises(CoordinatorError, match="was not assigned to"):
        apply_client_message(coord, REPORTER.public_key, message(a, b), 1000.0)
    mixed = commitment(TRAINER, b"blob b", seed=SEED ^ 1)
    with pytest.raises(CoordinatorError, match="different runs or rounds"):
        apply_client_message(
            coord, REPORTER.public_key, message(commitment(TRAINER, b"a"), mixed), 1000.0
        )
    assert coord.verification.convictions == []
    # the same pair inside the window convicts
    apply_client_message(
        coord,
        REPORTER.public_key,
        message(commitment(TRAINER, b"a"), commitment(TRAINER, b"b")),
        1000.0,
    )
    assert [c.trainer for c in coord.verification.convictions] == [TRAINER.public_key]

"""Equivocation: a trainer that signed two different commitments for one batch of one step.

An `EquivocationProof` is two `ResultCommitment`s (`psyche_common.announcements`) of the same
trainer for the same (run, round seed, step, batch) with different statements, both
signatures valid. Any
client that receives both sends them to the server; the proof needs no witness and no
quorum: an honest trainer signs one result per batch, so the proof is its own evidence.

`record_equivocation` (the coordinator's `equivocation(reporter, proof, verify)`) checks the
proof, both signatures with the `verify` it is given (the server passes
`protocol.identity.verify_signature`: the coordinator itself loads no cryptography, and takes
no proof without a signature check), and that it is about this run's open window: the run id
is the coordinator's, the step is still open (the current step, or the one before it during
RoundTrain with the same members), the round seed is that round's, and the batch is one the
round assigned to the trainer. Commitments signed in another run, in an earlier life of this
run (a restored state draws new seeds), for a closed step or a batch the key never had to
train prove nothing now and are refused; then it convicts the trainer on it
(`accusations.convict_proven`): it is dropped (it leaves the epoch at the next round start),
every client skips its results from the first step whose results are not yet final
(`first_open_step`) on, in that epoch (`VerificationRecord.excluded`), and no later epoch
admits the key (`VerificationRecord.banned`). A step's results are final once
the next round's witnesses are in (RoundWitness): from then on clients may apply them, so a
proof cannot change what they apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psyche_common.announcements import ResultCommitment, SignatureCheck
from psyche_common.client_id import short_id
from psyche_common.coordinator.accusations import convict_proven, round_of_open_step
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import RunState
from psyche_common.coordinator.verdicts import Conviction
from psyche_common.wire_checks import wire_map


@dataclass(frozen=True)
class EquivocationProof:
    """Two conflicting signed commitments of one trainer (see the module docstring)."""

    first: ResultCommitment
    second: ResultCommitment

    @property
    def trainer(self) -> bytes:
        return self.first.trainer

    def check(self, verify: SignatureCheck) -> None:
        """Raise ValueError naming what makes this no proof (signatures checked by `verify`)."""
        a, b = self.first, self.second
        if a.trainer != b.trainer:
            raise ValueError("the two commitments are signed by different trainers")
        if (a.run_id, a.round_seed) != (b.run_id, b.round_seed):
            raise ValueError(
                f"the commitments name different runs or rounds (run {a.run_id!r} seed "
                f"{a.round_seed}, run {b.run_id!r} seed {b.round_seed})"
            )
        if (a.step, a.batch) != (b.step, b.batch):
            raise ValueError(
                f"the commitments name different batches ({a.batch} of step {a.step}, "
                f"{b.batch} of step {b.step})"
            )
        if a.statement() == b.statement():
            raise ValueError("the two commitments are the same")
        for name, commitment in (("first", a), ("second", b)):
            if not commitment.verifies(verify):
                raise ValueError(
                    f"{name}.signature does not verify for trainer {short_id(a.trainer)}"
                )

    def to_wire(self) -> dict[str, Any]:
        return {"first": self.first.to_wire(), "second": self.second.to_wire()}

    @classmethod
    def from_wire(cls, data: Any) -> EquivocationProof:
        data = wire_map(data, "proof")
        return cls(
            ResultCommitment.from_wire(data.get("first"), "proof.first"),
            ResultCommitment.from_wire(data.get("second"), "proof.second"),
        )


def _refuse(detail: str) -> CoordinatorError:
    return CoordinatorError(ErrorKind.InvalidEquivocation, detail)


def check_open_window(coord: CoordinatorState, commitment: ResultCommitment) -> None:
    """Raise `CoordinatorError(InvalidEquivocation)` unless `commitment` names this run, a
    step still open, that round's seed and a batch the round assigned to its trainer."""
    if commitment.run_id != coord.run_id:
        raise _refuse(f"the commitments are for run {commitment.run_id!r}, not {coord.run_id!r}")
    round_ = round_of_open_step(coord, commitment.step, _refuse, "equivocation proofs")
    if commitment.round_seed != round_.random_seed:
        raise _refuse(
            f"the commitments name round seed {commitment.round_seed}, not step "
            f"{commitment.step}'s ({round_.random_seed})"
        )
    assignments = assign_data_for_round(
        round_, coord.epoch_state.clients, coord.config, coord.model.max_seq_len
    )
    if assignments.get(commitment.batch) != commitment.trainer:
        raise _refuse(
            f"{commitment.batch} of step {commitment.step} was not assigned to "
            f"{short_id(commitment.trainer)}"
        )


def first_open_step(coord: CoordinatorState) -> int:
    """The first step whose results no client may have applied yet: in RoundTrain of step C,
    C − 1 (its witnesses are still reporting); otherwise C."""
    step = coord.progress.step
    if coord.run_state == RunState.RoundTrain and step > 0:
        return step - 1
    return step


def record_equivocation(
    coord: CoordinatorState, reporter: bytes, proof: EquivocationProof, verify: SignatureCheck
) -> Conviction | None:
    """Check `proof` (sent by `reporter`; its signatures with `verify`) and convict its trainer
    on it; None when it is already convicted on proof in this epoch. Raises
    `CoordinatorError(InvalidEquivocation)` when the proof is not one."""
    try:
        proof.check(verify)
    except ValueError as exc:
        raise _refuse(str(exc)) from exc
    check_open_window(coord, proof.first)
    epoch = coord.progress.epoch
    if any(
        c.trainer == proof.trainer and c.epoch == epoch and c.proven
        for c in coord.verification.convictions
    ):
        return None
    return convict_proven(coord, proof.trainer, first_open_step(coord), proof.first.batch, reporter)
